"""The CPU GEMM of plain float32 weights for a few rows of x: launcher and reference.

`dense_gemm` runs ssd_kernels/cpu/dense_gemm.cpp (float32 FMAs on AVX-512 / AVX2; threads over output features) on
the weight as the checkpoint holds it, [N, K] row-major: no layout of its own. `dense_gemm_reference` is its
plain-torch twin.
"""

from types import ModuleType

import torch
import torch.nn.functional as F

STEP = 32  # K must be a multiple of this
TILE = 4  # output features per tile: N must be a multiple of this


def dense_gemm_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear: x [M, K], weight [N, K] -> [M, N]."""
    return F.linear(x, weight)


def dense_gemm(ext: ModuleType, x: torch.Tensor, weight: torch.Tensor, path: int) -> torch.Tensor:
    """x [M, K] @ weight.T -> [M, N], all float32."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"dense_gemm: x [M, K] and weight [N, K] do not match: {tuple(x.shape)}, {tuple(weight.shape)}")
    if x.shape[1] % STEP or weight.shape[0] % TILE:
        raise ValueError(f"dense_gemm: K must be a multiple of {STEP} and N of {TILE}, got weight {tuple(weight.shape)}")
    return ext.dense_gemm(x, weight, path)
