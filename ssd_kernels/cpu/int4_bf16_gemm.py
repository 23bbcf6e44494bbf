"""The CPU int4 GEMM of group-32 weights (GGUF Q4_0 / Q4_1 values) for bfloat16 activations on AVX512-BF16 or
AMX-BF16: launcher, layout and reference.

`int4_bf16_gemm` runs ssd_kernels/cpu/int4_bf16_gemm.cpp (threads over units of 64 output features) on a path:
BF16_AVX512 (exact products with the codes, scaled per group) or AMX_BF16 (the same blocks dequantized to bfloat16
weights as AMX tiles, where `tiles_exact` holds; ssd_kernels/cpu/group_amx_units.h). `int4_bf16_gemm_reference` is
their plain-torch twin (dequantize in float32, on AMX_BF16 round the weights to bfloat16, float32 products and sums,
rounded to bfloat16 once). Layout (see int4_bf16_gemm.cpp): blocks [N / 16, K / 32, 320] uint8, per block of 16 output
features and group of 32 input features the codes in 4 chunks of 32 16-bit words (nibble n of word 2f + h of chunk
c: feature f, input 2c + 8n + h; packed for AMX_BF16, of word 4 (f % 8) + 2h + f / 8), then the 16 d's and 16 m's
(fp16); w = q * d + m. Blocks run on the path they were packed for.
"""

from types import ModuleType

import torch
import torch.nn.functional as F

from ssd_kernels.cpu.bf16_units import check_operands, deinterleave_units, interleave_units
from ssd_kernels.cpu.extension import AMX_BF16, BF16_AVX512

BLOCK = 16  # output features per block: N must be a multiple of this
GROUP = 32  # input features per group: K must be a multiple of this
GROUP_BYTES = 320


def pack_q32_bf16(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, path: int = BF16_AVX512) -> torch.Tensor:
    """q [N, K] integers 0..15, d / m [N, K / 32] (w = q d + m, fp16-exact) -> the kernel's blocks for `path` (the
    AMX path reads the codes of a chunk in another word order: 4 (f % 8) + 2h + f / 8)."""
    n, k = q.shape
    if n % BLOCK or k % GROUP or d.shape != (n, k // GROUP) or m.shape != d.shape:
        raise ValueError(f"int4_bf16_gemm packs N a multiple of {BLOCK} and K of {GROUP} with d / m [N, K / 32], "
                         f"got q {tuple(q.shape)}, d {tuple(d.shape)}, m {tuple(m.shape)}")
    g = q.to(torch.int32).view(n // BLOCK, BLOCK, k // GROUP, 4, 4, 2)  # [B, f, G, nibble, c, h]: k = 8 nibble + 2c + h
    words = g[..., 0, :, :] | g[..., 1, :, :] << 4 | g[..., 2, :, :] << 8 | g[..., 3, :, :] << 12  # [B, f, G, c, h]
    if path == AMX_BF16:  # f = 8 s + f8 -> [B, G, c, f8, h, s]
        words = words.view(n // BLOCK, 2, 8, k // GROUP, 4, 2).permute(0, 3, 4, 2, 5, 1)
    else:
        words = words.permute(0, 2, 3, 1, 4)  # [B, G, c, f, h]
    codes = words.to(torch.int16).contiguous().view(torch.uint8).view(n // BLOCK, k // GROUP, 256)  # (int16 wraps
    # above 0x7FFF: the bits are kept)
    def scales(s: torch.Tensor) -> torch.Tensor:  # [N, G] -> [B, G, 32] bytes of the 16 features' fp16 values
        s = s.to(torch.float16).view(n // BLOCK, BLOCK, k // GROUP).permute(0, 2, 1).contiguous()
        return s.view(torch.uint8)
    return interleave_units(torch.cat([codes, scales(d), scales(m)], -1))  # [B, G, 320], units interleaved


def tiles_exact(d: torch.Tensor, m: torch.Tensor) -> bool:
    """Whether the AMX path computes every w = q d + m of these d / m [N, K / 32] in one float32 rounding: it adds
    (128 + q) d to m - 128 d, which must then be a float32 number (it is unless m is far below 128 d's precision)."""
    shifted = m.double() - 128 * d.double()
    return torch.equal(shifted.float().double(), shifted)


def unpack_q32_bf16(blocks: torch.Tensor, path: int = BF16_AVX512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `pack_q32_bf16`: (q [N, K] uint8, d [N, G] float32, m [N, G] float32)."""
    blocks = deinterleave_units(blocks)
    nb, groups, _ = blocks.shape
    words = blocks[..., :256].contiguous().view(torch.int16)
    if path == AMX_BF16:  # [B, G, c, f8, h, s] -> [B, G, c, s, f8, h]
        words = words.view(nb, groups, 4, 8, 2, 2).permute(0, 1, 2, 5, 3, 4)
    words = words.reshape(nb, groups, 4, BLOCK, 2).to(torch.int32)  # [B, G, c, f, h]
    q = torch.stack([(words >> (4 * i)) & 0xF for i in range(4)], 2)  # [B, G, nibble, c, f, h]
    q = q.permute(0, 4, 1, 2, 3, 5).reshape(nb * BLOCK, groups * GROUP).to(torch.uint8)  # [N, K]
    def scales(raw: torch.Tensor) -> torch.Tensor:  # [B, G, 32] bytes -> [N, G] float32
        return raw.contiguous().view(torch.float16).permute(0, 2, 1).reshape(nb * BLOCK, groups).float()
    return q, scales(blocks[..., 256:288]), scales(blocks[..., 288:])


def int4_bf16_gemm_reference(x: torch.Tensor, blocks: torch.Tensor, path: int = BF16_AVX512) -> torch.Tensor:
    """Dequantize in float32 (AMX_BF16: then round the weights to bfloat16, as that path does), then F.linear in
    float32, rounded to bfloat16: x [M, K] -> [M, N]."""
    q, d, m = unpack_q32_bf16(blocks, path)
    n, k = q.shape
    w = q.view(n, k // GROUP, GROUP).float() * d[..., None] + m[..., None]  # [N, G, 32]
    w = w.view(n, k)
    if path == AMX_BF16:
        w = w.bfloat16().float()
    return F.linear(x.float(), w).bfloat16()


def int4_bf16_gemm(ext: ModuleType, x: torch.Tensor, blocks: torch.Tensor, path: int = BF16_AVX512) -> torch.Tensor:
    """x [M, K] bfloat16 @ w.T -> [M, N] bfloat16, w given by `blocks` packed for `path` (BF16_AVX512: exact products,
    scaled per group; AMX_BF16: the weights dequantized to bfloat16 as tiles)."""
    check_operands("int4_bf16_gemm", x, blocks, GROUP, GROUP_BYTES)
    return ext.int4_bf16_gemm(x, blocks, path)
