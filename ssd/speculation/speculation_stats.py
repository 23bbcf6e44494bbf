"""SpecStats, the one record of speculation statistics: the engine's totals and each request's summary.

Counted by the engine (speculative_decoder.py) and read by attribute everywhere; string keys only at the edges (the
proto / HTTP usage, the bench JSON), each mapped once there. Undefined ratios (nothing counted yet) are None.
"""

import copy
from dataclasses import dataclass, field, fields


def ratio(num: float, den: float) -> float | None:
    """num / den, None when nothing was counted (den = 0)."""
    return num / den if den else None


@dataclass
class SpecStats:
    num_drafts: int = 0  # verify rounds (one per sequence per round)
    num_draft_tokens: int = 0  # draft tokens proposed
    num_accepted_tokens: int = 0  # draft tokens the target kept
    num_emitted_tokens: int = 0  # accepted + bonus tokens
    num_plain_steps: int = 0  # adaptive (auto) sequences: decode steps taken plainly, where plain measured faster
    num_sd_rounds: int = 0  # adaptive SSD sequences: rounds speculated as plain SD (of num_drafts; no cache lookup)
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
        self.accepted_per_position += [0] * (num_accepted - len(self.accepted_per_position))
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1

    def snapshot(self) -> "SpecStats":
        return copy.deepcopy(self)

    def since(self, before: "SpecStats") -> "SpecStats":
        """What was counted after `before` (a snapshot of these same stats)."""
        out = SpecStats(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)
                           if f.name != "accepted_per_position"})
        out.accepted_per_position = [n - (before.accepted_per_position[j] if j < len(before.accepted_per_position)
                                          else 0) for j, n in enumerate(self.accepted_per_position)]
        return out

    @property
    def accept_rate(self) -> float | None:  # accepted draft tokens / proposed
        return ratio(self.num_accepted_tokens, self.num_draft_tokens)

    @property
    def tokens_per_round(self) -> float | None:
        """Tokens emitted per verify round (accepted + bonus): the mean accepted length plus one."""
        return ratio(self.num_emitted_tokens, self.num_drafts)

    @property
    def num_cache_lookups(self) -> int:  # SSD rounds verified (0: no SSD)
        return self.num_cache_hits + self.num_cache_misses

    @property
    def cache_hit_rate(self) -> float | None:
        return ratio(self.num_cache_hits, self.num_cache_lookups)

    @property
    def tokens_per_round_hit(self) -> float | None:
        return ratio(self.emitted_after_hit, self.num_cache_hits)

    @property
    def tokens_per_round_miss(self) -> float | None:
        return ratio(self.emitted_after_miss, self.num_cache_misses)

    @property
    def predicted_hit_rate(self) -> float | None:
        return ratio(self.predicted_hit_sum, self.num_predicted)

    @property
    def propose_ms_per_round(self) -> float | None:
        """Batch rounds: getting the proposals (a local draft's forwards, or the draft's answer round trip)."""
        return ratio(1e3 * self.propose_s, self.num_rounds)

    @property
    def verify_ms_per_round(self) -> float | None:
        return ratio(1e3 * self.verify_s, self.num_rounds)
