"""The engine's configuration and the speculation settings: frozen dataclasses, built once at the entry point.

The vocabulary of settings is defined here once, below every layer that reads it (runtime, speculation, engine).
"""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from ssd.device import DEVICE_PATTERN
from ssd.dtypes import DTYPE_CHOICES
from ssd.errors import InvalidRequestError

E = TypeVar("E", bound=StrEnum)

MAX_LOOKAHEAD = 32
MAX_TREE_BUDGET = 128  # draft nodes per tree at most: the verify forward takes budget + 1 positions per sequence
QUANTIZATION_CHOICES = ("none", "auto", "int8", "int4")  # int4 also as "int4:G", G input features per group
QUANTIZATION_PATTERN = re.compile(r"none|auto|int8|int4(:(32|64|128|256))?")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flash-attn")  # ssd/layers/attention_backend.py
COMPILE_MODES = ("auto", "on", "off")  # torch.compile of the model forward (ssd/runtime/compile.py)


class DecodeMode(StrEnum):
    """How a request decodes (the values are the names on every edge: flags, HTTP, JSON)."""

    AR = "ar"  # one token per target forward
    SD = "sd"  # synchronous speculation: draft, then verify
    SSD = "ssd"  # the draft answers from its speculation cache and builds the next one while the target verifies


class FanOut(StrEnum):
    """The shape of the SSD fan-out over acceptance lengths."""

    GEOMETRIC = "geometric"  # from the measured acceptance (SSD.md section 5)
    UNIFORM = "uniform"  # the same number of guesses at every acceptance length


class Backup(StrEnum):
    """What the SSD draft answers on a cache miss."""

    AUTO = "auto"  # NEURAL up to `SsdConfig.backup_max_neural_batch` sequences, FAST above
    NEURAL = "neural"  # draft now with the neural draft
    FAST = "fast"  # n-gram lookup


def check_saguaro_c(c: float) -> None:
    if not 0.0 < c <= 1.0:
        raise InvalidRequestError(f"the Saguaro constant C must be in (0, 1], got {c}")


def parse_enum(kind: type[E], value: object, what: str) -> E:
    """`value` as a member of `kind` (a member or its string); InvalidRequestError naming the choices if neither."""
    try:
        return kind(value)
    except ValueError:
        raise InvalidRequestError(f"{what} must be one of {', '.join(kind)}, got {value!r}") from None


@dataclass(frozen=True)
class TreeShape:
    """Token-tree expansion limits: EAGLE-2 style top-k expansion under a node budget."""

    budget: int = 16  # draft nodes in the tree at most
    depth: int = 4  # tree depth at most
    top_k: int = 2  # children tried per expanded node

    def __post_init__(self) -> None:
        if self.budget < 1 or self.depth < 1 or self.top_k < 1:
            raise InvalidRequestError(f"tree budget, depth and top-k must be >= 1, got {self}")
        if self.budget > MAX_TREE_BUDGET:
            raise InvalidRequestError(f"tree budget must be <= {MAX_TREE_BUDGET}, got {self.budget}")



@dataclass(frozen=True)
class SsdConfig:
    """Speculative speculative decoding (SSD.md): the draft answers from a cache it builds while the target verifies."""

    fan_out_budget: int = 8  # bonus-token guesses prepared per sequence and round (sum of the fan-out shape)
    fan_out: FanOut = FanOut.GEOMETRIC  # the fan-out shape (a string naming one is converted)
    backup: Backup = Backup.FAST  # on a miss (a string naming one is converted); docs/ssd.md says why fast
    backup_max_neural_batch: int = 4  # auto: neural backup up to this batch size, fast above
    saguaro_c: float = 1.0  # scales the draft's top-F probabilities before sampling; 1 = plain sampling
    # when some sequences of a round miss and get a neural backup, re-draft the hits in the same batched forwards
    # too (from the target's real features, as SD does) instead of returning their cached speculations
    backup_hits: bool = False
    # with a neural backup, a round of several sequences builds caches only when all of them hit at least this
    # likely (the measured hit rate to the batch size); else it drafts them all now, as SD (0 = always build)
    round_hit_floor: float = 0.0
    # fit the budget of each round's build to the time the draft has (ssd/speculation/fan_out_fit.py): the build
    # should end before the next answer is asked for; fan_out_budget is then the most a round prepares
    fit_fan_out: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.fan_out_budget <= 256:
            raise InvalidRequestError(f"fan-out budget must be in [0, 256], got {self.fan_out_budget}")
        if not 0 <= self.round_hit_floor <= 1:
            raise InvalidRequestError(f"round hit floor must be in [0, 1], got {self.round_hit_floor}")
        object.__setattr__(self, "fan_out", parse_enum(FanOut, self.fan_out, "fan-out"))
        object.__setattr__(self, "backup", parse_enum(Backup, self.backup, "backup"))
        check_saguaro_c(self.saguaro_c)

    def backup_for(self, batch_size: int) -> Backup:
        """NEURAL or FAST for a round of `batch_size` sequences."""
        if self.backup is not Backup.AUTO:
            return self.backup
        return Backup.NEURAL if batch_size <= self.backup_max_neural_batch else Backup.FAST


@dataclass(frozen=True)
class ProposerChoice:
    """Which proposer drafts, apart from how much it speculates (SpeculationConfig)."""

    draft: str  # "ngram", a draft checkpoint folder / known model name, or an EAGLE-3 head folder
    draft_dtype: str | None = None  # None = the target's dtype
    ngram_max: int = 3  # n-gram proposer: longest tail matched (also the SSD fast backup)

    @property
    def is_ngram(self) -> bool:
        return self.draft == "ngram"


@dataclass(frozen=True)
class SpeculationConfig:
    proposer: ProposerChoice  # who drafts; the fields below say how much, in what shape
    num_speculative_tokens: int = 4  # lookahead K (for a tree: its depth limit)
    tree: TreeShape | None = None  # None = chain speculation
    # (max batch size, K) pairs in increasing batch order; above the last pair K is 0 (plain decoding).
    # None = K up to batch 4, K // 2 up to batch 16, then off.
    k_schedule: tuple[tuple[int, int], ...] | None = None
    ssd: SsdConfig | None = None  # None = synchronous SD; set = SSD (needs a neural draft, chains only)

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOOKAHEAD:
            raise InvalidRequestError(f"lookahead K must be an integer in [0, {MAX_LOOKAHEAD}], got {k!r}")
        if self.ssd is not None and self.tree is not None:
            raise InvalidRequestError("SSD speculates chains; drop the token tree or use sd")
        if self.ssd is not None and self.proposer.is_ngram:
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


@dataclass(frozen=True)
class EngineConfig:
    model: str  # checkpoint folder, or a known model name (see `ssd models list`)
    dtype: str = "auto"  # auto (bfloat16 where the device runs it natively, else float32) | float32 | bfloat16 | ...
    block_size: int = 16  # tokens per KV block
    kv_cache_memory_mb: int = 1024  # KV cache budget; the number of blocks is derived from it
    max_num_seqs: int = 16  # sequences in one batch at most
    max_num_batched_tokens: int = 8192  # tokens in one forward at most
    # While sequences are decoding, a prefill forward feeds at most this many prompt tokens and they step between
    # two chunks (a long prompt delays their next token by one chunk, not by its whole prefill); 0 = off.
    prefill_chunk_tokens: int = 256
    max_model_len: int | None = None  # prompt + output tokens at most; default: the model's limit
    enable_prefix_caching: bool = True
    num_threads: int | None = None  # torch intra-op threads (CPU work); None leaves torch's default
    seed: int = 0  # seeds the generator of requests that bring no seed
    speculation: SpeculationConfig | None = None  # None = plain autoregressive decoding
    # onednn: packed CPU matmuls; torch: plain F.linear (the reference). On CUDA both mean plain F.linear:
    # packing is a CPU-only layout, so it is skipped there rather than refused (onednn is the default).
    linear_backend: str = "onednn"
    # cpu | cuda | cuda:N: where the model forward runs (weights, KV, hidden states); sampling stays on CPU.
    # Checked against the machine (a GPU present, N in range) when the engine is built.
    device: str = "cpu"
    # Ranks the target is sharded over (heads, MLP width, vocabulary): rank 0 runs in this process, the others
    # as worker processes on this machine (CPU, gloo collectives). Each rank gets `num_threads` threads
    # (default: this machine's cores / size).
    tensor_parallel_size: int = 1
    # How the ranks exchange partial results: "auto" = a shared memory mapping (x86; tensors up to 4 MB) and gloo
    # for the rest; "gloo" = gloo over localhost TCP only (the slow reference).
    tensor_parallel_collectives: str = "auto"
    # The target's linear weights (ssd/loader/quantize.py): none | auto (the checkpoint's own quantization, if
    # any) | int8 (per channel) | int4 | int4:G (G = 32, 64, 128, 256 input features per group). Drafts stay float.
    quantization: str = "none"
    # Attention kernel: auto = flash-attn / triton on CUDA where installed, the torch path elsewhere.
    attention_backend: str = "auto"
    # torch.compile of the model forward: on | off | auto (= where it measured faster: nowhere yet, see
    # ssd/runtime/compile.py resolve_compile).
    compile: str = "auto"
    enforce_eager: bool = False  # as vLLM's: no compile, no CUDA graphs, whatever `compile` says

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_cache_memory_mb", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.prefill_chunk_tokens, int) or self.prefill_chunk_tokens < 0:
            raise InvalidRequestError(f"prefill_chunk_tokens must be >= 0, got {self.prefill_chunk_tokens!r}")
        if self.prefill_chunk_tokens == 1:
            raise InvalidRequestError("prefill_chunk_tokens must be 0 (off) or >= 2")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidRequestError(f"max_model_len must be >= 2, got {self.max_model_len}")
        for name, choices in (("dtype", DTYPE_CHOICES), ("linear_backend", ("onednn", "torch")),
                              ("tensor_parallel_collectives", ("auto", "gloo")),
                              ("attention_backend", ATTENTION_BACKENDS), ("compile", COMPILE_MODES)):
            if getattr(self, name) not in choices:
                raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise InvalidRequestError(f"num_threads must be >= 1, got {self.num_threads}")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise InvalidRequestError(f"tensor_parallel_size must be a positive integer, got {self.tensor_parallel_size!r}")
        if self.tensor_parallel_size > 1 and self.device != "cpu":
            raise InvalidRequestError("tensor parallelism runs on CPU ranks only so far (gloo); use --device cpu")
        if not QUANTIZATION_PATTERN.fullmatch(self.quantization):
            raise InvalidRequestError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)} "
                                      f"(int4 also int4:32 .. int4:256), got {self.quantization!r}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise InvalidRequestError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
