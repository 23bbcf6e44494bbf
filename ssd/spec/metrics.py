"""Speculation counters: engine-wide totals and a per-request summary."""

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    num_drafts: int = 0  # verify rounds (one per sequence per round)
    num_draft_tokens: int = 0  # draft tokens proposed
    num_accepted_tokens: int = 0  # draft tokens the target kept
    num_emitted_tokens: int = 0  # accepted + bonus tokens
    accepted_per_position: list[int] = field(default_factory=list)  # [j] = rounds accepting >= j+1 tokens

    def record(self, num_proposed: int, num_accepted: int, num_emitted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        self.num_emitted_tokens += num_emitted
        while len(self.accepted_per_position) < num_accepted:
            self.accepted_per_position.append(0)
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1

    @property
    def accept_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.num_emitted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def as_dict(self) -> dict:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accept_rate": self.accept_rate,
            "tokens_per_round": self.tokens_per_round,
            "mean_accepted_length": self.mean_accepted_length,
            "accepted_per_position": list(self.accepted_per_position),
        }
