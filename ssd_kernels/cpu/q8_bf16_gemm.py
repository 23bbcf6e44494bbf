"""The CPU GEMM of group-32 int8 weights (GGUF Q8_0 values, w = q * d) for bfloat16 activations on AVX512-BF16 or
AMX-BF16 (the weights dequantized to bfloat16 as AMX tiles, ssd_kernels/cpu/group_amx_units.h): launcher, layout and
reference.

`q8_bf16_gemm` runs ssd_kernels/cpu/q8_bf16_gemm.cpp (threads over units of 64 output features);
`q8_bf16_gemm_reference` is its plain-torch twin (dequantize in float32, on AMX_BF16 round the weights to bfloat16,
float32 products and sums, rounded to bfloat16 once). Layout (see q8_bf16_gemm.cpp): blocks [N / 16, K / 32, 544]
uint8, per block of 16 output features and group of 32 input features 16 chunks of 32 codes (byte 2f + h of chunk
c: feature f, input 2c + h), then the 16 d's (fp16).
"""

from types import ModuleType

import torch
import torch.nn.functional as F

from ssd_kernels.cpu.bf16_units import check_operands, deinterleave_units, interleave_units
from ssd_kernels.cpu.extension import AMX_BF16, BF16_AVX512

BLOCK = 16  # output features per block: N must be a multiple of this
GROUP = 32  # input features per group: K must be a multiple of this
GROUP_BYTES = 544


def pack_q8_bf16(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q [N, K] integers -128..127, d [N, K / 32] (fp16-exact; w = q d) -> the kernel's blocks."""
    n, k = q.shape
    if n % BLOCK or k % GROUP or d.shape != (n, k // GROUP):
        raise ValueError(f"q8_bf16_gemm packs N a multiple of {BLOCK} and K of {GROUP} with d [N, K / 32], "
                         f"got q {tuple(q.shape)}, d {tuple(d.shape)}")
    codes = q.to(torch.int8).view(n // BLOCK, BLOCK, k // GROUP, GROUP // 2, 2)  # [B, f, G, c, h]
    codes = codes.permute(0, 2, 3, 1, 4).reshape(n // BLOCK, k // GROUP, 512).view(torch.uint8)  # [B, G, c, f, h]
    ds = d.to(torch.float16).view(n // BLOCK, BLOCK, k // GROUP).permute(0, 2, 1).contiguous()  # [B, G, 16]
    return interleave_units(torch.cat([codes, ds.view(torch.uint8)], -1))  # [B, G, 544], units interleaved


def unpack_q8_bf16(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack_q8_bf16`: (q [N, K] int8, d [N, G] float32)."""
    blocks = deinterleave_units(blocks)
    nb, groups, _ = blocks.shape
    codes = blocks[..., :512].contiguous().view(torch.int8).view(nb, groups, GROUP // 2, BLOCK, 2)  # [B, G, c, f, h]
    q = codes.permute(0, 3, 1, 2, 4).reshape(nb * BLOCK, groups * GROUP)  # [N, K]
    d = blocks[..., 512:].contiguous().view(torch.float16).view(nb, groups, BLOCK)
    return q, d.permute(0, 2, 1).reshape(nb * BLOCK, groups).float()


def q8_bf16_gemm_reference(x: torch.Tensor, blocks: torch.Tensor, path: int = BF16_AVX512) -> torch.Tensor:
    """Dequantize in float32 (AMX_BF16: then round the weights to bfloat16, as that path does), then F.linear in
    float32, rounded to bfloat16: x [M, K] -> [M, N]."""
    q, d = unpack_q8_bf16(blocks)
    n, k = q.shape
    w = q.view(n, k // GROUP, GROUP).float() * d[..., None]  # [N, G, 32]
    w = w.view(n, k)
    if path == AMX_BF16:
        w = w.bfloat16().float()
    return F.linear(x.float(), w).bfloat16()


def q8_bf16_gemm(ext: ModuleType, x: torch.Tensor, blocks: torch.Tensor, path: int = BF16_AVX512) -> torch.Tensor:
    """x [M, K] bfloat16 @ w.T -> [M, N] bfloat16, w given by `blocks` in this module's layout, on `path`
    (BF16_AVX512: exact products, scaled per group; AMX_BF16: the weights dequantized to bfloat16 as tiles)."""
    check_operands("q8_bf16_gemm", x, blocks, GROUP, GROUP_BYTES)
    return ext.q8_bf16_gemm(x, blocks, path)
