"""Speculative decoding settings: the proposer, lookahead K and its schedule by batch size, trees."""

from dataclasses import dataclass

from ssd.errors import InvalidRequestError
from ssd.spec.proposer import TreeShape

MAX_LOOKAHEAD = 32


@dataclass(frozen=True)
class SpeculationConfig:
    draft: str  # "ngram", a draft checkpoint folder / known model name, or an EAGLE-3 head folder
    num_speculative_tokens: int = 4  # lookahead K (for a tree: its depth limit)
    tree: TreeShape | None = None  # None = chain speculation
    # (max batch size, K) pairs in increasing batch order; above the last pair K is 0 (plain decoding).
    # None = K up to batch 4, K // 2 up to batch 16, then off.
    k_schedule: tuple[tuple[int, int], ...] | None = None
    draft_dtype: str | None = None  # None = the target's dtype
    ngram_max: int = 3  # n-gram proposer: longest tail matched

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOOKAHEAD:
            raise InvalidRequestError(f"lookahead K must be an integer in [0, {MAX_LOOKAHEAD}], got {k!r}")
        for batch, kk in self.k_schedule or ():
            if batch < 1 or not 0 <= kk <= MAX_LOOKAHEAD:
                raise InvalidRequestError(f"bad k_schedule entry ({batch}, {kk})")

    def lookahead_for(self, batch_size: int) -> int:
        """K for a decode batch of this size (0 turns speculation off)."""
        k = self.num_speculative_tokens
        schedule = self.k_schedule or ((4, k), (16, max(1, k // 2)) if k else (16, 0))
        for max_batch, kk in schedule:
            if batch_size <= max_batch:
                return min(kk, k)
        return 0
