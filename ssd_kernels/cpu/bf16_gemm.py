"""The CPU GEMM of bfloat16 weights on AVX512-BF16 (vdpbf16ps) or AMX-BF16 (tiles): launcher, layout and reference.

`bf16_gemm` runs ssd_kernels/cpu/bf16_gemm.cpp (threads over units of 64 output features), or bf16_amx.cpp on the
AMX path (the same blocks as AMX tiles, K a multiple of 32); `bf16_gemm_reference` is their plain-torch twin
(float32 products and sums, rounded to bfloat16 once). The two paths round differently (a pair's products join the
sum in another order), so a model runs all its row counts on one of them (`path_for`).
Layout (see bf16_gemm.cpp): blocks [N / 16, K / 2, 32] bfloat16, per block of 16 output features and pair of input
features the 16 features' two weights, feature-major.
"""

from types import ModuleType

import torch
import torch.nn.functional as F

from ssd_kernels.cpu.extension import AMX_BF16, BF16_AVX512, supported_paths

BLOCK = 16  # output features per block: N must be a multiple of this (and K of 2)
AMX_CHUNK = 32  # inputs per AMX tile product: the AMX path needs K a multiple of this


def path_for(ext: ModuleType, k: int, amx: bool = True) -> int | None:
    """The path for a weight of K inputs on this CPU: AMX_BF16 where it runs and K fits its tiles (unless `amx` is
    off), else BF16_AVX512; None where neither runs."""
    paths = supported_paths(ext)
    if amx and AMX_BF16 in paths and k % AMX_CHUNK == 0:
        return AMX_BF16
    return BF16_AVX512 if BF16_AVX512 in paths else None


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bfloat16 -> the kernel's blocks [N / 16, K / 2, 32]."""
    n, k = weight.shape
    if weight.dtype != torch.bfloat16 or n % BLOCK or k % 2:
        raise ValueError(f"bf16_gemm packs bfloat16 weights with N a multiple of {BLOCK} and K of 2, "
                         f"got {weight.dtype} {tuple(weight.shape)}")
    blocks = weight.detach().reshape(n // BLOCK, BLOCK, k // 2, 2).permute(0, 2, 1, 3)  # [N/16, K/2, 16, 2]
    return blocks.reshape(n // BLOCK, k // 2, 2 * BLOCK).contiguous()


def unpack_bf16(blocks: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_bf16`: the weight [N, K]."""
    nb, pairs, _ = blocks.shape
    return blocks.view(nb, pairs, BLOCK, 2).permute(0, 2, 1, 3).reshape(nb * BLOCK, 2 * pairs)


def bf16_gemm_reference(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """F.linear in float32 on the unpacked weight, rounded to bfloat16: x [M, K] -> [M, N]."""
    return F.linear(x.float(), unpack_bf16(blocks).float()).bfloat16()


def bf16_gemm(ext: ModuleType, x: torch.Tensor, blocks: torch.Tensor, path: int = BF16_AVX512) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] bfloat16, w given by `blocks` in this module's layout, on `path` (BF16_AVX512 or
    AMX_BF16)."""
    if x.dim() != 2 or blocks.dim() != 3 or blocks.shape[1:] != (x.shape[1] // 2, 2 * BLOCK) or x.shape[1] % 2:
        raise ValueError(f"bf16_gemm: x [M, K] and blocks [N/16, K/2, 32] do not match: "
                         f"{tuple(x.shape)}, {tuple(blocks.shape)}")
    return ext.bf16_gemm(x, blocks, path)
