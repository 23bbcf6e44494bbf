"""Speculative decoding settings: the proposer, lookahead K and its schedule by batch size, trees."""

from dataclasses import dataclass

from ssd.errors import InvalidRequestError
from ssd.speculation.fanout import FAN_OUT_KINDS
from ssd.speculation.proposer import TreeShape
from ssd.speculation.saguaro import check_saguaro_c

MAX_LOOKAHEAD = 32
BACKUP_KINDS = ("auto", "neural", "fast")


@dataclass(frozen=True)
class SsdConfig:
    """Speculative speculative decoding (SSD.md): the draft answers from a cache it builds while the target verifies."""

    fan_out_budget: int = 8  # bonus-token guesses prepared per sequence and round (sum of the fan-out shape)
    fan_out: str = "geometric"  # "geometric" (from measured acceptance) or "uniform"
    backup: str = "auto"  # on a miss: "neural" (draft now), "fast" (n-gram lookup), "auto" (by batch size)
    backup_max_neural_batch: int = 4  # auto: neural backup up to this batch size, fast above
    saguaro_c: float = 1.0  # scales the draft's top-F probabilities before sampling; 1 = plain sampling

    def __post_init__(self) -> None:
        if not 0 <= self.fan_out_budget <= 256:
            raise InvalidRequestError(f"fan-out budget must be in [0, 256], got {self.fan_out_budget}")
        if self.fan_out not in FAN_OUT_KINDS:
            raise InvalidRequestError(f"fan-out must be one of {FAN_OUT_KINDS}, got {self.fan_out!r}")
        if self.backup not in BACKUP_KINDS:
            raise InvalidRequestError(f"backup must be one of {BACKUP_KINDS}, got {self.backup!r}")
        check_saguaro_c(self.saguaro_c)

    def backup_for(self, batch_size: int) -> str:
        if self.backup != "auto":
            return self.backup
        return "neural" if batch_size <= self.backup_max_neural_batch else "fast"


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
    ssd: SsdConfig | None = None  # None = synchronous SD; set = SSD (needs a neural draft, chains only)

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOOKAHEAD:
            raise InvalidRequestError(f"lookahead K must be an integer in [0, {MAX_LOOKAHEAD}], got {k!r}")
        if self.ssd is not None and self.tree is not None:
            raise InvalidRequestError("SSD speculates chains; drop the token tree or use sd")
        if self.ssd is not None and self.draft == "ngram":
            raise InvalidRequestError("SSD needs a neural draft (a draft model or an EAGLE-3 head), not n-gram lookup")
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
