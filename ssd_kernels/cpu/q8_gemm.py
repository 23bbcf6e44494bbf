"""The CPU GEMM of group-32 int8 weights (GGUF Q8_0 values, w = q * d): launcher, layout and reference.

`q8_gemm` runs ssd_kernels/cpu/q8_gemm.cpp (float32 AVX2 / AVX-512, threads over output features);
`q8_gemm_reference` is its plain-torch twin. The extension that holds it is built by ssd_kernels/cpu/extension.py.
Layout (see q8_gemm.cpp): blocks [N / 4, K / 32, 136] uint8, a tile of 4 output features' codes and d's per group.
"""

from types import ModuleType

import torch
import torch.nn.functional as F

GROUP = 32
TILE = 4  # output features per block
BLOCK_BYTES = TILE * GROUP + TILE * 2


def pack_q8(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q [N, K] integers -128..127, d [N, K / 32] (fp16-exact; w = q d) -> the kernel's blocks."""
    n, k = q.shape
    if n % TILE or k % GROUP or d.shape != (n, k // GROUP):
        raise ValueError(f"q8_gemm packs N a multiple of {TILE}, K of {GROUP} and d [N, K / {GROUP}], "
                         f"got q {tuple(q.shape)}, d {tuple(d.shape)}")
    codes = q.to(torch.int8).view(n // TILE, TILE, k // GROUP, GROUP).permute(0, 2, 1, 3)  # [T, G, 4, 32]
    codes = codes.reshape(n // TILE, k // GROUP, -1).view(torch.uint8)  # [T, G, 128]
    ds = d.to(torch.float16).view(n // TILE, TILE, k // GROUP).permute(0, 2, 1).contiguous()  # [T, G, 4]
    return torch.cat([codes, ds.view(torch.uint8)], -1).contiguous()  # [T, G, 136]


def unpack_q8(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack_q8`: (q [N, K] int8, d [N, G] float32)."""
    t, g, _ = blocks.shape
    q = blocks[..., : TILE * GROUP].contiguous().view(torch.int8).view(t, g, TILE, GROUP)
    q = q.permute(0, 2, 1, 3).reshape(t * TILE, g * GROUP)  # [N, K]
    d = blocks[..., TILE * GROUP :].contiguous().view(torch.float16).view(t, g, TILE)
    return q, d.permute(0, 2, 1).reshape(t * TILE, g).float()


def dequantize(blocks: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] that `blocks` holds (q * d, exact)."""
    q, d = unpack_q8(blocks)
    n, k = q.shape
    return (q.view(n, -1, GROUP).float() * d[..., None]).view(n, k)


def q8_gemm_reference(x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Dequantize in float32, then F.linear in float32: x [M, K] -> [M, N] in x's dtype."""
    return F.linear(x.float(), dequantize(blocks)).to(x.dtype)


def q8_gemm(ext: ModuleType, x: torch.Tensor, blocks: torch.Tensor, path: int) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] in x's dtype, w given by `blocks` in this module's layout."""
    if x.dim() != 2 or blocks.dim() != 3 or blocks.shape[1:] != (x.shape[1] // GROUP, BLOCK_BYTES) \
            or x.shape[1] % GROUP:
        raise ValueError(f"q8_gemm: x [M, K] and blocks [N/4, K/32, {BLOCK_BYTES}] do not match: "
                         f"{tuple(x.shape)}, {tuple(blocks.shape)}")
    return ext.q8_gemm(x, blocks, path)
