"""The CPU int4 GEMM of group-32 weights (GGUF Q4_0 / Q4_1 values): launcher, layout and reference.

`int4_gemm` runs ssd_kernels/cpu/int4_gemm.cpp (float32 AVX2 / AVX-512, or int8 activations with AVX-512 VNNI;
threads over output features), `int4_gemm_reference` is its plain-torch twin. The extension that holds it is
built by ssd_kernels/cpu/extension.py.
Layout (see int4_gemm.cpp): blocks [N / 4, K / 64, 144] uint8 (a tile of 4 output features' codes and d's per
pair of groups), mins [N, K / 32] fp16; w = q * d + m.
"""

from types import ModuleType

import torch
import torch.nn.functional as F

from ssd_kernels.cpu.extension import FLOAT_AVX512, VNNI_AVX512

GROUP = 32
TILE = 4  # output features per block


def pack_q32(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] integers 0..15, d / m [N, K / 32] (w = q d + m) -> the kernel's (blocks, mins)."""
    n, k = q.shape
    if n % TILE or k % (2 * GROUP):
        raise ValueError(f"int4_gemm packs N a multiple of {TILE} and K of {2 * GROUP}, got {n} x {k}")
    g = q.to(torch.uint8).view(n // TILE, TILE, k // (2 * GROUP), 2, 2, GROUP // 2)  # [T, 4, P, group, half, 16]
    codes = (g[..., 0, :] | (g[..., 1, :] << 4)).permute(0, 2, 1, 3, 4).reshape(n // TILE, k // (2 * GROUP), -1)
    ds = d.to(torch.float16).view(n // TILE, TILE, k // (2 * GROUP), 2).permute(0, 2, 1, 3)  # [T, P, 4, 2]
    ds = ds.reshape(n // TILE, k // (2 * GROUP), -1).view(torch.uint8)  # [T, P, 16] bytes
    blocks = torch.cat([codes, ds], -1).contiguous()  # [T, P, 144]
    return blocks, m.to(torch.float16).view(torch.int16).contiguous()


def unpack_q32(blocks: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `pack_q32`: (q [N, K] uint8, d [N, G] float32, m [N, G] float32)."""
    t, p, _ = blocks.shape
    codes = blocks[..., : TILE * 32].reshape(t, p, TILE, 2, GROUP // 2)  # [T, P, 4, group, 16]
    q = torch.stack([codes & 0xF, codes >> 4], -2)  # [T, P, 4, group, half, 16]
    q = q.permute(0, 2, 1, 3, 4, 5).reshape(t * TILE, -1)  # [N, K]
    ds = blocks[..., TILE * 32 :].contiguous().view(torch.float16).view(t, p, TILE, 2)
    d = ds.permute(0, 2, 1, 3).reshape(t * TILE, -1).float()  # [N, G]
    return q, d, mins.view(torch.float16).float()


def round_activations_reference(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 as the VNNI path sees it: int8 in groups of 32, scale amax / 127 (returned dequantized)."""
    g = x.float().view(x.shape[0], -1, GROUP)  # [M, G, 32]
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(g * inv) * (amax / 127.0)).view(x.shape)


def int4_gemm_reference(x: torch.Tensor, blocks: torch.Tensor, mins: torch.Tensor, path: int = FLOAT_AVX512) -> torch.Tensor:
    """Dequantize in float32, then F.linear in float32: x [M, K] -> [M, N] in x's dtype. With VNNI_AVX512 the
    product with d uses x rounded to int8 (`round_activations_reference`), the one with m x itself, as the kernel."""
    q, d, m = unpack_q32(blocks, mins)
    n, k = q.shape
    xf = x.float()
    if path != VNNI_AVX512:
        w = q.view(n, k // GROUP, GROUP).float() * d[..., None] + m[..., None]  # [N, G, 32]
        return F.linear(xf, w.view(n, k)).to(x.dtype)
    wd = (q.view(n, k // GROUP, GROUP).float() * d[..., None]).view(n, k)  # [N, K]
    group_sums = xf.view(x.shape[0], -1, GROUP).sum(-1)  # [M, G]
    return (F.linear(round_activations_reference(xf), wd) + group_sums @ m.t()).to(x.dtype)


def int4_gemm(ext: ModuleType, x: torch.Tensor, blocks: torch.Tensor, mins: torch.Tensor, path: int) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] in x's dtype, w given by (blocks, mins) in this module's layout."""
    n, num_groups = mins.shape
    if x.dim() != 2 or x.shape[1] != num_groups * GROUP or blocks.shape != (n // TILE, num_groups // 2, TILE * 36):
        raise ValueError(f"int4_gemm: x [M, K], blocks [N/4, K/64, 144], mins [N, K/32] do not match: "
                         f"{tuple(x.shape)}, {tuple(blocks.shape)}, {tuple(mins.shape)}")
    return ext.int4_gemm(x, blocks, mins, path)
