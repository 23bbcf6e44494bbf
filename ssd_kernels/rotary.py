"""Rotary position embedding, neox style (rotate-half), from cos/sin tables indexed by each token's position.

Matches ssd/layers/rotary.py exactly: the float32 table rows are rounded to x's dtype, and
`x * cos + rotate_half(x) * sin` rounds each product and the sum to x's dtype, where
rotate_half([x1, x2]) = [-x2, x1] over the two halves of the head dimension.
"""

import torch

from ssd_kernels._checks import (
    FLOAT_DTYPES,
    check_contiguous,
    check_dtype,
    check_ndim,
    check_same_device,
    check_shape,
)
from ssd_kernels._triton import HAS_TRITON, is_interpreting, next_power_of_2, require_triton, tl, triton

if HAS_TRITON:

    @triton.jit
    def _rotary_kernel(
        x_ptr, positions_ptr, cos_ptr, sin_ptr, out_ptr,
        stride_xt, stride_xh, stride_table,
        NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        position = tl.load(positions_ptr + token).to(tl.int64)
        heads = tl.arange(0, BLOCK_H)
        cols = tl.arange(0, BLOCK_HALF)
        col_ok = cols < HALF
        mask = (heads < NUM_HEADS)[:, None] & col_ok[None, :]
        dtype = x_ptr.dtype.element_ty
        table = position * stride_table + cols  # [BLOCK_HALF] first half; + HALF for the second
        cos1 = tl.load(cos_ptr + table, mask=col_ok).to(dtype).to(tl.float32)[None, :]
        cos2 = tl.load(cos_ptr + table + HALF, mask=col_ok).to(dtype).to(tl.float32)[None, :]
        sin1 = tl.load(sin_ptr + table, mask=col_ok).to(dtype).to(tl.float32)[None, :]
        sin2 = tl.load(sin_ptr + table + HALF, mask=col_ok).to(dtype).to(tl.float32)[None, :]
        offs = token * stride_xt + heads[:, None] * stride_xh + cols[None, :]  # [BLOCK_H, BLOCK_HALF]
        x1 = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        x2 = tl.load(x_ptr + offs + HALF, mask=mask).to(tl.float32)
        # every product and sum rounded to x's dtype, as torch computes `x * cos + rotate_half(x) * sin`
        out1 = ((x1 * cos1).to(dtype).to(tl.float32) - (x2 * sin1).to(dtype).to(tl.float32)).to(dtype)
        out2 = ((x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)).to(dtype)
        out_offs = token * NUM_HEADS * 2 * HALF + heads[:, None] * 2 * HALF + cols[None, :]
        tl.store(out_ptr + out_offs, out1, mask=mask)
        tl.store(out_ptr + out_offs + HALF, out2, mask=mask)


def _check_inputs(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_ndim("x", x, 3, "[T, heads, D]")
    check_dtype("x", x, FLOAT_DTYPES)
    if x.shape[2] % 2 or x.stride(2) != 1:
        raise ValueError(f"x must have an even, contiguous head dimension, got shape {tuple(x.shape)} "
                         f"strides {x.stride()}")
    check_shape("positions", positions, (x.shape[0],), "[T]")
    check_dtype("positions", positions, (torch.int32, torch.int64))
    check_contiguous("positions", positions)
    check_ndim("cos", cos, 2, "[max_positions, D]")
    if cos.shape[1] != x.shape[2]:
        raise ValueError(f"cos must be [max_positions, D={x.shape[2]}], got {tuple(cos.shape)}")
    check_shape("sin", sin, tuple(cos.shape), "[max_positions, D] like cos")
    for name, t in (("cos", cos), ("sin", sin)):
        check_dtype(name, t, (torch.float32,))
        check_contiguous(name, t)
    check_same_device(x=x, positions=positions, cos=cos, sin=sin)
    if x.device.type != "cuda" and not is_interpreting():
        raise ValueError(f"rotary_embedding runs on CUDA tensors (or under TRITON_INTERPRET=1), "
                         f"got {x.device}")


def rotary_embedding(
    x: torch.Tensor,  # [T, heads, D] queries or keys
    positions: torch.Tensor,  # [T] int64 (or int32) RoPE position of each token
    cos: torch.Tensor,  # [max_positions, D] float32
    sin: torch.Tensor,  # [max_positions, D] float32
) -> torch.Tensor:  # [T, heads, D], contiguous, x's dtype
    """Triton rotary embedding; positions must be < max_positions (not checked on the device)."""
    require_triton("rotary_embedding")
    _check_inputs(x, positions, cos, sin)
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            x, positions, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0),
            NUM_HEADS=num_heads, HALF=head_dim // 2, BLOCK_H=next_power_of_2(num_heads),
            BLOCK_HALF=next_power_of_2(head_dim // 2),
        )
    return out


def rotary_embedding_reference(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:  # [T, heads, D]
    """Plain torch, the math of ssd/layers/rotary.py."""
    c = cos[positions].unsqueeze(1).to(x.dtype)  # [T, 1, D]
    s = sin[positions].unsqueeze(1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat((-x2, x1), dim=-1) * s
