"""Speculation counters: engine-wide totals and a per-request summary."""

from dataclasses import dataclass, field


@dataclass
class SpecCounters:
    num_drafts: int = 0  # verify rounds (one per sequence per round)
    num_draft_tokens: int = 0  # draft tokens proposed
    num_accepted_tokens: int = 0  # draft tokens the target kept
    num_emitted_tokens: int = 0  # accepted + bonus tokens
    accepted_per_position: list[int] = field(default_factory=list)  # [j] = rounds accepting >= j+1 tokens
    # SSD rounds only: was the verified speculation a cache hit, and what did it yield
    num_cache_hits: int = 0
    num_cache_misses: int = 0
    emitted_after_hit: int = 0
    emitted_after_miss: int = 0
    predicted_hit_sum: float = 0.0  # the draft's predicted hit probabilities of these lookups
    num_predicted: int = 0
    num_predicted_hits: int = 0  # actual hits among the lookups that had a prediction
    # engine-wide round timings (batch rounds, not per sequence): proposing (draft / lookup) vs the verify forward
    num_rounds: int = 0
    propose_s: float = 0.0
    verify_s: float = 0.0

    def record_round_time(self, propose_s: float, verify_s: float) -> None:
        self.num_rounds += 1
        self.propose_s += propose_s
        self.verify_s += verify_s

    def record(self, num_proposed: int, num_accepted: int, num_emitted: int, cache_hit: bool | None = None,
               predicted_hit: float | None = None) -> None:
        if cache_hit is not None:
            self.num_cache_hits += cache_hit
            self.num_cache_misses += not cache_hit
            if cache_hit:
                self.emitted_after_hit += num_emitted
            else:
                self.emitted_after_miss += num_emitted
            if predicted_hit is not None:
                self.predicted_hit_sum += predicted_hit
                self.num_predicted += 1
                self.num_predicted_hits += cache_hit
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

    @property
    def cache_hit_rate(self) -> float:
        lookups = self.num_cache_hits + self.num_cache_misses
        return self.num_cache_hits / lookups if lookups else 0.0

    def ssd_dict(self) -> dict:
        return {
            "cache_hits": self.num_cache_hits,
            "cache_misses": self.num_cache_misses,
            "cache_hit_rate": self.cache_hit_rate,
            "tokens_per_round_hit": self.emitted_after_hit / self.num_cache_hits if self.num_cache_hits else 0.0,
            "tokens_per_round_miss": (self.emitted_after_miss / self.num_cache_misses
                                      if self.num_cache_misses else 0.0),
            "predicted_hit_rate": self.predicted_hit_sum / self.num_predicted if self.num_predicted else 0.0,
            "actual_hit_rate_when_predicted": self.num_predicted_hits / self.num_predicted if self.num_predicted else 0.0,
        }

    def as_dict(self) -> dict:
        ssd = self.ssd_dict() if self.num_cache_hits + self.num_cache_misses else {}
        return {
            **ssd,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accept_rate": self.accept_rate,
            "tokens_per_round": self.tokens_per_round,
            "mean_accepted_length": self.mean_accepted_length,
            "accepted_per_position": list(self.accepted_per_position),
        }
