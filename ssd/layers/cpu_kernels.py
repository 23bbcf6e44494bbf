"""The project's own CPU kernels (ssd_kernels/cpu) as the layers use them: built once per process into the cache
folder, their weight layouts made from the portable quantized weights, their paths chosen by dtype and CPU.

int4: group-32 weights whose scales and mins are exact in fp16 (the GGUF's own Q4_0 / Q4_1 values), so it
computes the checkpoint's weights exactly, for up to MAX_ROWS rows of x. Its float path (dequantize in registers,
float32 accumulation; equal to the dequantizing reference within float32 rounding) serves every dtype; asked for
int8 activations (Int4Kernel.OWN_INT8), 16-bit activations run its VNNI path where the CPU has one (rounded to
int8 in groups of 32, as llama.cpp does). bfloat16 activations on AVX512-BF16 run a second int4 kernel of their own
layout (`int4_bf16_layout`: 16 output features per vector, the codes as exact bfloat16 numbers, vdpbf16ps), or on
an AMX-BF16 CPU whose engine decodes 3 or more sequences a step the same blocks as AMX tiles of the weights
dequantized to bfloat16 (`quantized_bf16_path`, `decode_batch`). Which layers use it: Int4Kernel in
ssd/layers/quantized_linear.py.
q8: group-32 int8 weights with fp16 scales (the GGUF's own Q8_0 LM head), float path, and for bfloat16 activations on
AVX512-BF16 a kernel of the int4 bfloat16 kernel's kind and paths (`q8_bf16_layout`); ParallelLMHead uses them.
Float weights (`own_matmul_for`): bfloat16 in the bf16 kernel's blocks on AVX512-BF16 (any number of rows; read as
AMX tiles where the CPU has AMX-BF16, unless SSD_CPU_AMX=0: up to 16 rows for one row's time), float32 as it is on
AVX2 / AVX-512 (up to MAX_ROWS rows); every float linear layer, LM head and EAGLE-3 head linear uses them where
torch's GEMMs read the weight far below the memory's speed at few rows (docs/benchmarks.md).
Layer ops (`layer_ops_for`): RMSNorm, RoPE, SiLU-and-multiply and few-query attention, one call each in place of
3-20 torch ops; ssd/layers/norm.py, rotary.py, activation.py and the "cpu" attention backend use them. A whole
decoder layer runs as one call of them where its linears have a `LinearKind` (ssd/layers/fused_layer.py).
Where the extension cannot be built, one warning is logged and the caller keeps torch's path.
"""

import enum
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import structlog
import torch

from ssd.paths import cache_root
from ssd_kernels.cpu import bf16_gemm, dense_gemm, q8_bf16_gemm, q8_gemm
from ssd_kernels.cpu import extension as own_ext
from ssd_kernels.cpu import int4_bf16_gemm as own_bf16
from ssd_kernels.cpu import int4_gemm as own

log = structlog.get_logger(__name__)

# The most rows of x the int4 and Q8_0 kernels serve: they re-read the weight for every 4 rows, so a prefill is left
# to torch's GEMMs.
# Decode steps, verifies of K + 1 <= 16 positions and trees of up to 16 nodes in all stay on them.
MAX_ROWS = 16


@cache
def extension() -> ModuleType | None:
    """The compiled kernels, or None (logged once) where they cannot be built or this CPU runs none of their paths."""
    started = time.perf_counter()
    log.info("loading the project's CPU kernels (the first start on a machine compiles them: 1-3 minutes)")
    try:
        ext = own_ext.load_extension(cache_root() / "kernels")
        log.info("the project's CPU kernels are ready", seconds=round(time.perf_counter() - started, 1))
    except own_ext.KernelBuildError as e:
        log.warning("own CPU kernels unavailable; using torch's paths", error=str(e))
        return None
    if not own_ext.supported_paths(ext):
        log.warning("own CPU kernels: this CPU has neither AVX2 nor AVX-512; using torch's paths")
        return None
    return ext


def loaded_extension() -> ModuleType | None:
    """The compiled kernels where this process loaded them already (a CPU engine's layers did), else None: no build
    (a GPU engine's host work must not compile them)."""
    return extension() if extension.cache_info().currsize else None


def _q32_scales(weight_scales: torch.Tensor, weight_zeros: torch.Tensor,
                q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(d, m) with w = q d + m for q [N, K] (0..15) with scales / zeros [N, K / 32] in the (q - 8) * scale + zero
    convention; None where they are not group-32 scales exact in fp16 (the kernels store fp16)."""
    n, k = q.shape
    if weight_scales.shape != (n, k // own.GROUP) or k % own.GROUP:
        return None
    d = weight_scales.float()
    m = weight_zeros.float() - 8 * d
    if not (torch.equal(d.half().float(), d) and torch.equal(m.half().float(), m)):
        return None
    return d, m


def int4_layout(weight_scales: torch.Tensor, weight_zeros: torch.Tensor,
                  q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(blocks, mins) of the int4 kernel for q [N, K] (0..15) with scales / zeros [N, K / 32] in the (q - 8) * scale +
    zero convention; None where the kernel cannot hold them exactly (other groups, shapes, non-fp16 scales)."""
    n, k = q.shape
    scales = _q32_scales(weight_scales, weight_zeros, q)
    if scales is None or n % own.TILE or k % (2 * own.GROUP):
        return None
    return own.pack_q32(q, *scales)


def int4_bf16_layout(weight_scales: torch.Tensor, weight_zeros: torch.Tensor,
                     q: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(blocks, path) of the int4 kernel for bfloat16 activations (as `int4_layout`'s arguments): the path is
    `quantized_bf16_path`'s where its tiles compute every w = q d + m in one rounding, else BF16_AVX512; None where the
    kernel cannot hold the weight exactly or this CPU has no AVX512-BF16 (or no build)."""
    scales = _q32_scales(weight_scales, weight_zeros, q)
    if scales is None or q.shape[0] % own_bf16.BLOCK or not _runs_bf16_kernels():
        return None
    path = quantized_bf16_path()
    if path == own_ext.AMX_BF16 and not own_bf16.tiles_exact(*scales):
        path = own_ext.BF16_AVX512
    return own_bf16.pack_q32_bf16(q, *scales, path), path


def _blocks_op(name: str, block: int) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """The custom op `ssd::<name>` over the extension's `name(x, blocks, path)` (blocks of `block` output features),
    for torch.compile: graphs call the op, eager calls the extension directly (the op's dispatch costs)."""

    @torch.library.custom_op(f"ssd::{name}", mutates_args=())
    def op(x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
        return getattr(extension(), name)(x, blocks, path)

    @op.register_fake
    def _(x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], blocks.shape[0] * block)

    return op


_int4_bf16_op = _blocks_op("int4_bf16_gemm", own_bf16.BLOCK)
_q8_bf16_op = _blocks_op("q8_bf16_gemm", q8_bf16_gemm.BLOCK)


def int4_bf16_matmul(x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
    """x [M, K] bfloat16 @ w.T -> [M, N] bfloat16 for (blocks, path) made by `int4_bf16_layout` (so the extension
    built)."""
    if torch.compiler.is_compiling():
        return _int4_bf16_op(x, blocks, path)
    return extension().int4_bf16_gemm(x, blocks, path)  # type: ignore[union-attr]


def int4_bf16_call(blocks: torch.Tensor, path: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`int4_bf16_matmul` for eager calls, with the extension looked up once."""
    gemm = extension().int4_bf16_gemm  # type: ignore[union-attr]
    return lambda x: gemm(x, blocks, path)


@cache
def path_for(ext: ModuleType, dtype: torch.dtype, is_int8_activations: bool) -> int:
    """The kernel path for activations of `dtype` on this CPU (int8 ones: 16-bit activations, where it has VNNI)."""
    if is_int8_activations and dtype != torch.float32 and own_ext.VNNI_AVX512 in own_ext.supported_paths(ext):
        return own_ext.VNNI_AVX512
    return own_ext.float_path(ext)


def int4_matmul(x: torch.Tensor, blocks: torch.Tensor, mins: torch.Tensor, is_int8_activations: bool) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] in x's dtype (the extension must have built: `extension()` is not None).
    Under torch.compile it is the custom op `ssd::int4_gemm` (eager calls skip the op's dispatch cost)."""
    ext = extension()
    assert ext is not None, "the own int4 kernel runs only where it built"
    path = path_for(ext, x.dtype, is_int8_activations)
    if torch.compiler.is_compiling():
        return torch.ops.ssd.int4_gemm(x, blocks, mins, path)
    return ext.int4_gemm(x, blocks, mins, path)


def int4_call(blocks: torch.Tensor, mins: torch.Tensor, dtype: torch.dtype,
              is_int8_activations: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """`int4_matmul` for eager calls on x of `dtype`, with the extension and path looked up once."""
    ext = extension()
    assert ext is not None, "the own int4 kernel runs only where it built"
    gemm, path = ext.int4_gemm, path_for(ext, dtype, is_int8_activations)
    return lambda x: gemm(x, blocks, mins, path)


@torch.library.custom_op("ssd::int4_gemm", mutates_args=())
def _int4_gemm_op(x: torch.Tensor, blocks: torch.Tensor, mins: torch.Tensor, path: int) -> torch.Tensor:
    return extension().int4_gemm(x, blocks, mins, path)  # type: ignore[union-attr]


@_int4_gemm_op.register_fake
def _(x: torch.Tensor, blocks: torch.Tensor, mins: torch.Tensor, path: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], mins.shape[0])


def _q8_holds(codes: torch.Tensor, scales: torch.Tensor, block: int) -> bool:
    """Whether a q8 kernel with `block` output features per block holds codes [N, K] int8 and scales [N, K / 32]
    exactly (the shapes fit, the scales are fp16 values) and the extension is built here."""
    n, k = codes.shape
    if n % block or k % q8_gemm.GROUP or scales.shape != (n, k // q8_gemm.GROUP):
        return False
    return torch.equal(scales.float().half().float(), scales.float()) and extension() is not None


def _runs_bf16_kernels() -> bool:
    """Whether this CPU runs the AVX512-BF16 kernels (and the extension is built)."""
    ext = extension()
    return ext is not None and own_ext.BF16_AVX512 in own_ext.supported_paths(ext)


def q8_layout(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """The q8 kernel's blocks for codes [N, K] int8 and scales [N, K / 32] (w = q * scale); None where the kernel
    cannot hold them exactly (other shapes, non-fp16 scales) or cannot be built here."""
    return q8_gemm.pack_q8(codes, scales.float()) if _q8_holds(codes, scales, q8_gemm.TILE) else None


def q8_bf16_layout(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(blocks, path) of the q8 bfloat16 kernel for codes [N, K] int8 and scales [N, K / 32] (the path:
    `quantized_bf16_path`'s; its tiles hold q d exactly); None where it cannot hold them exactly (other shapes,
    non-fp16 scales), this CPU has no AVX512-BF16, or the extension cannot be built here."""
    if not (_q8_holds(codes, scales, q8_bf16_gemm.BLOCK) and _runs_bf16_kernels()):
        return None
    return q8_bf16_gemm.pack_q8_bf16(codes, scales.float()), quantized_bf16_path()


def q8_bf16_matmul(x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
    """x [M, K] bfloat16 @ w.T -> [M, N] bfloat16, for (blocks, path) made by `q8_bf16_layout`."""
    if torch.compiler.is_compiling():
        return _q8_bf16_op(x, blocks, path)
    return extension().q8_bf16_gemm(x, blocks, path)  # type: ignore[union-attr]


def q8_matmul(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] in x's dtype, for blocks made by `q8_layout` (so the extension built)."""
    ext = extension()
    assert ext is not None, "the own q8 kernel runs only where it built"
    if torch.compiler.is_compiling():
        return torch.ops.ssd.q8_gemm(x, blocks, own_ext.float_path(ext))
    return ext.q8_gemm(x, blocks, own_ext.float_path(ext))


@torch.library.custom_op("ssd::q8_gemm", mutates_args=())
def _q8_gemm_op(x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
    return extension().q8_gemm(x, blocks, path)  # type: ignore[union-attr]


@_q8_gemm_op.register_fake
def _(x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], blocks.shape[0] * q8_gemm.TILE)


_own_float = {"enabled": True, "amx": True}
# "0": bfloat16 linears keep the AVX512-BF16 loop and attention the vector loops on an AMX CPU (set it for every
# process of a deployment)
AMX_ENV = "SSD_CPU_AMX"


def _amx_allowed() -> bool:
    return _own_float["amx"] and os.environ.get(AMX_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# The fewest sequences per decode step for which the quantized kernels take AMX tiles: the tiles dequantize every
# weight to bfloat16 (~9 vector operations per 32 weights), which costs ~1.8x the AVX512-BF16 loop at one row and
# wins from ~3 rows on (Sapphire Rapids, docs/benchmarks.md). A model keeps one path for all its row counts (the
# two round differently), so the engine's batch limit decides: its plain steps and verifies then share the path,
# and an engine that decodes one sequence at a time keeps the loop that is fastest for one row.
TILES_FROM_SEQUENCES = 3
_batch = {"most": None}  # max_num_seqs of the engine whose model is being loaded (None: unknown)


@contextmanager
def decode_batch(most: int | None) -> Iterator[None]:
    """While loading a model: its engine decodes at most `most` sequences per step; the quantized kernels choose
    their path by it (`quantized_bf16_path`)."""
    before, _batch["most"] = _batch["most"], most
    try:
        yield
    finally:
        _batch["most"] = before


def quantized_bf16_path() -> int:
    """The path of the group-32 quantized kernels for bfloat16 activations (int4, Q8_0) packed now: AMX_BF16 where
    the CPU has it, AMX is allowed (`_amx_allowed`) and the engine decodes TILES_FROM_SEQUENCES sequences or more per
    step (`decode_batch`; unknown counts as more), else BF16_AVX512 (the caller checked that one runs)."""
    ext = extension()
    amx = ext is not None and own_ext.AMX_BF16 in own_ext.supported_paths(ext) and _amx_allowed()
    few = _batch["most"] is not None and _batch["most"] < TILES_FROM_SEQUENCES
    return own_ext.AMX_BF16 if amx and not few else own_ext.BF16_AVX512


def set_own_float_kernels(enabled: bool, amx: bool = True) -> None:
    """Whether float linear layers packed from now on (`_Linear.pack`) use the own float kernels (the default) or
    oneDNN's packed GEMM, and whether bfloat16 and quantized ones take the AMX path where the CPU has it (benchmarks
    compare them)."""
    _own_float["enabled"], _own_float["amx"] = enabled, amx


@dataclass(frozen=True)
class OwnMatmul:
    """A float linear layer's matmul on the project's own kernel: x [M, K] -> [M, N] in the weight's dtype."""

    kind: "LinearKind"  # DENSE_OWN (float32, the weight as it is) or BF16_OWN (bfloat16 blocks)
    tensor: torch.Tensor  # the weight [N, K], or its blocks (ssd_kernels/cpu/bf16_gemm.py)
    path: int  # DENSE_OWN's: float32 AVX-512 / AVX2; BF16_OWN's: BF16_AVX512 or AMX_BF16
    max_rows: int | None  # the most rows it serves (more: oneDNN's GEMM), None: any

    def serves(self, x: torch.Tensor) -> bool:
        """An inference call (no autograd: the kernels have no backward) on x [M, K] of the weight's dtype, eager (a
        graph keeps torch's linear), within max_rows."""
        if x.dim() != 2 or x.dtype != self.tensor.dtype or x.device.type != "cpu":
            return False
        if self.max_rows is not None and x.shape[0] > self.max_rows:
            return False
        return not torch.is_grad_enabled() and not torch.compiler.is_compiling()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ext = extension()
        if self.kind == LinearKind.BF16_OWN:
            return ext.bf16_gemm(x, self.tensor, self.path)  # type: ignore[union-attr]
        return ext.dense_gemm(x, self.tensor, self.path)  # type: ignore[union-attr]


def own_matmul_for(weight: torch.Tensor) -> OwnMatmul | None:
    """The own kernel for this inference weight [N, K] on this CPU: bfloat16 on AMX-BF16 or else AVX512-BF16 (its
    blocks, any number of rows: on Zen 4 the AVX512-BF16 loop matched or beat oneDNN from 1 to 512 rows; on Sapphire
    Rapids it grows with the rows from ~5, where the AMX tiles cost about one row's time up to 16), float32 on AVX2 /
    AVX-512 (the weight as it is, up to MAX_ROWS rows); None elsewhere (other dtypes, shapes or devices, no build)."""
    if (not _own_float["enabled"] or weight.dim() != 2 or weight.device.type != "cpu"
            or weight.dtype not in (torch.bfloat16, torch.float32)):
        return None
    ext = extension()
    if ext is None:
        return None
    n, k = weight.shape
    if weight.dtype == torch.bfloat16:
        path = bf16_gemm.path_for(ext, k, _amx_allowed())
        if path is None or n % bf16_gemm.BLOCK or k % 2:
            return None
        return OwnMatmul(LinearKind.BF16_OWN, bf16_gemm.pack_bf16(weight), path, None)
    if n % dense_gemm.TILE or k % dense_gemm.STEP:
        return None
    return OwnMatmul(LinearKind.DENSE_OWN, weight.detach().contiguous(), own_ext.float_path(ext), MAX_ROWS)


class LinearKind(enum.IntEnum):
    """How the fused decoder layer runs a linear layer's matmul (the kinds of ssd_kernels/cpu/cpu_kernels.h)."""

    DENSE = 0  # F.linear on the weight
    PACKED = 1  # oneDNN's packed weight (torch.ops.mkldnn._linear_pointwise)
    INT4_OWN = 2  # the own int4 kernel: weight = blocks, aux = mins, param = path
    INT4_PACK = 3  # torch's CPU int4pack kernel: aux = scales and zeros, param = group size
    INT8_PACK = 4  # torch's int8pack kernel: aux = scales
    DENSE_OWN = 5  # the own float32 kernel on the weight: param = path
    BF16_OWN = 6  # the own bfloat16 kernel: weight = its blocks
    INT4_BF16 = 7  # the own int4 kernel for bfloat16 activations: weight = its blocks


def linear_op(ext: ModuleType, kind: LinearKind, weight: torch.Tensor, aux: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, param: int = 0) -> object:
    """The extension's Linear: x @ w.T (+ bias) by `kind`, as the layer's own matmul computes it."""
    return ext.Linear(int(kind), weight, aux, bias, param)


_layer_ops = {"enabled": True}


def set_layer_ops(enabled: bool) -> None:
    """Turn the fused layer ops (RMSNorm, RoPE, SiLU-and-multiply, few-query attention) on or off for this
    process; on by default. Off, the layers run their plain torch ops (the references the kernels are tested on)."""
    _layer_ops["enabled"] = enabled


def layer_ops_enabled() -> bool:
    return _layer_ops["enabled"]


def attention_path(dtype: torch.dtype, head_dim: int) -> int:
    """The path of the few-query attention op (`paged_attention`, `rope_attention`, the fused layers) for a model of
    this dtype and head size: AMX_BF16 for bfloat16 with head size 64 or 128 on a CPU with AMX-BF16 where AMX is
    allowed (SSD_CPU_AMX; ssd_kernels/cpu/attention_amx.cpp: the scores as tile products, 1.6-1.7x the vector loops
    at a verify's 5 queries a sequence, on par at one), else 0 (the vector loops). The two round differently,
    so every call of a process takes the same one."""
    return _attention_path(dtype, head_dim, _amx_allowed())


@cache
def _attention_path(dtype: torch.dtype, head_dim: int, amx_allowed: bool) -> int:
    ext = extension()
    if ext is None or not amx_allowed or dtype != torch.bfloat16 or head_dim not in (64, 128):
        return 0
    return own_ext.AMX_BF16 if own_ext.AMX_BF16 in own_ext.supported_paths(ext) else 0


def layer_ops_for(x: torch.Tensor, *params: torch.Tensor) -> ModuleType | None:
    """The extension, where the fused layer ops serve `x` (an eager float32 / bfloat16 CPU tensor) and the layer's
    `params`; else None. The ops have no backward: where autograd records (training a draft), torch's ops run."""
    if not _layer_ops["enabled"] or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
        return None
    if torch.compiler.is_compiling():  # a graph keeps torch's ops, which inductor fuses itself
        return None
    return extension()
