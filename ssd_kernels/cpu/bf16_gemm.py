"""The CPU GEMM of bfloat16 weights on AVX512-BF16 (vdpbf16ps): launcher, layout and reference.

`bf16_gemm` runs ssd_kernels/cpu/bf16_gemm.cpp (threads over units of 64 output features); `bf16_gemm_reference`
is its plain-torch twin (float32 products and sums, rounded to bfloat16 once).
Layout (see bf16_gemm.cpp): blocks [N / 16, K / 2, 32] bfloat16, per block of 16 output features and pair of input
features the 16 features' two weights, feature-major.
"""

from types import ModuleType

import torch
import torch.nn.functional as F

BLOCK = 16  # output features per block: N must be a multiple of this (and K of 2)


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


def bf16_gemm(ext: ModuleType, x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] bfloat16, w given by `blocks` in this module's layout."""
    if x.dim() != 2 or blocks.dim() != 3 or blocks.shape[1:] != (x.shape[1] // 2, 2 * BLOCK) or x.shape[1] % 2:
        raise ValueError(f"bf16_gemm: x [M, K] and blocks [N/16, K/2, 32] do not match: "
                         f"{tuple(x.shape)}, {tuple(blocks.shape)}")
    return ext.bf16_gemm(x, blocks)
