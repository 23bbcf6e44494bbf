"""The project's own CPU int4 kernel (ssd_kernels/cpu/int4_gemm) as Int4Matmul uses it: built once per process into
the cache folder, its weight layout made from the portable int4 weights, its path chosen by dtype and CPU.

It serves group-32 weights whose scales and mins are exact in fp16 (the GGUF's own Q4_0 / Q4_1 values), so it
computes the checkpoint's weights exactly, for up to MAX_ROWS rows of x. Its float path (dequantize in registers,
float32 accumulation; equal to the dequantizing reference within float32 rounding) serves every dtype; asked for
int8 activations (Int4Kernel.OWN_INT8), 16-bit activations run its VNNI path where the CPU has one (rounded to
int8 in groups of 32, as llama.cpp does). Where the extension cannot be built, one warning is logged and the
caller keeps torch's path. Which layers use it: Int4Kernel in ssd/layers/quantized_linear.py.
"""

import time
from functools import cache
from types import ModuleType

import structlog
import torch

from ssd.paths import cache_root
from ssd_kernels.cpu import int4_gemm as own

log = structlog.get_logger(__name__)

# The most rows of x it serves: it re-reads the weight for every 4 rows, so a prefill is left to torch's GEMMs.
# Decode steps, verifies of K + 1 <= 16 positions and trees of up to 16 nodes per sequence stay on it.
MAX_ROWS = 16


@cache
def extension() -> ModuleType | None:
    """The compiled kernel, or None (logged once) where it cannot be built or this CPU runs none of its paths."""
    started = time.perf_counter()
    log.info("loading the project's int4 CPU kernel (the first start on a machine compiles it: 1-3 minutes)")
    try:
        ext = own.load_extension(cache_root() / "kernels")
        log.info("the project's int4 CPU kernel is ready", seconds=round(time.perf_counter() - started, 1))
    except own.KernelBuildError as e:
        log.warning("own int4 CPU kernel unavailable; using torch's int4 path", error=str(e))
        return None
    if not own.supported_paths(ext):
        log.warning("own int4 CPU kernel: this CPU has neither AVX2 nor AVX-512; using torch's int4 path")
        return None
    return ext


def kernel_layout(weight_scales: torch.Tensor, weight_zeros: torch.Tensor,
                  q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(blocks, mins) of the kernel for q [N, K] (0..15) with scales / zeros [N, K / 32] in the (q - 8) * scale +
    zero convention; None where the kernel cannot hold them exactly (other groups, shapes, non-fp16 scales)."""
    n, k = q.shape
    if weight_scales.shape != (n, k // own.GROUP) or n % own.TILE or k % (2 * own.GROUP):
        return None
    d = weight_scales.float()
    m = weight_zeros.float() - 8 * d  # w = q d + m
    if not (torch.equal(d.half().float(), d) and torch.equal(m.half().float(), m)):
        return None
    return own.pack_q32(q, d, m)


@cache
def path_for(ext: ModuleType, dtype: torch.dtype, is_int8_activations: bool) -> int:
    """The kernel path for activations of `dtype` on this CPU (int8 ones: 16-bit activations, where it has VNNI)."""
    paths = own.supported_paths(ext)
    if is_int8_activations and dtype != torch.float32 and own.VNNI_AVX512 in paths:
        return own.VNNI_AVX512
    return own.FLOAT_AVX512 if own.FLOAT_AVX512 in paths else own.FLOAT_AVX2


def matmul(x: torch.Tensor, blocks: torch.Tensor, mins: torch.Tensor, is_int8_activations: bool) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] in x's dtype (the extension must have built: `extension()` is not None)."""
    ext = extension()
    assert ext is not None, "the own int4 kernel runs only where it built"
    return ext.int4_gemm(x, blocks, mins, path_for(ext, x.dtype, is_int8_activations))
