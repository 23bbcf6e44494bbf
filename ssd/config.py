"""The engine's configuration: one frozen dataclass, built once at the entry point and passed down."""

from dataclasses import dataclass

from ssd.device import DEVICE_PATTERN
from ssd.dtypes import DTYPE_CHOICES
from ssd.errors import InvalidRequestError
from ssd.speculation.config import SpeculationConfig


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
        if self.dtype not in DTYPE_CHOICES:
            raise InvalidRequestError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.linear_backend not in ("onednn", "torch"):
            raise InvalidRequestError(f"linear_backend must be 'onednn' or 'torch', got {self.linear_backend!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise InvalidRequestError(f"num_threads must be >= 1, got {self.num_threads}")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise InvalidRequestError(f"tensor_parallel_size must be a positive integer, got {self.tensor_parallel_size!r}")
        if self.tensor_parallel_collectives not in ("auto", "gloo"):
            raise InvalidRequestError(
                f"tensor_parallel_collectives must be 'auto' or 'gloo', got {self.tensor_parallel_collectives!r}")
        if self.tensor_parallel_size > 1 and self.device != "cpu":
            raise InvalidRequestError("tensor parallelism runs on CPU ranks only so far (gloo); use --device cpu")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise InvalidRequestError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
