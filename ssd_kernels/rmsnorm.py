"""RMSNorm over the last dimension, alone or fused with the residual add before it.

Matches ssd/layers/norm.py: x is normalized in float32, rounded to its dtype, then scaled by the weight;
the fused form returns (norm(x + residual), x + residual) with the sum rounded to x's dtype first.
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
    def _rmsnorm_kernel(
        x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, eps,
        N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(residual_ptr + row * N + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # rounded like torch's add
            tl.store(new_residual_ptr + row * N + cols, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)
        normed = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * N + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _check_inputs(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    check_ndim("x", x, 2, "[N, hidden]")
    check_dtype("x", x, FLOAT_DTYPES)
    check_contiguous("x", x)
    check_shape("weight", weight, (x.shape[1],), "[hidden]")
    check_dtype("weight", weight, FLOAT_DTYPES)
    check_contiguous("weight", weight)
    if residual is not None:
        check_shape("residual", residual, tuple(x.shape), "[N, hidden] like x")
        check_dtype("residual", residual, (x.dtype,))
        check_contiguous("residual", residual)
    check_same_device(x=x, weight=weight, **({} if residual is None else {"residual": residual}))
    if x.device.type != "cuda" and not is_interpreting():
        raise ValueError(f"rms_norm runs on CUDA tensors (or under TRITON_INTERPRET=1), got {x.device}")


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new residual; the normed output again without a residual)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)  # as `weight * x.to(dtype)` gives
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)  # [N, hidden]
    new_residual = torch.empty_like(x) if residual is not None else out
    if x.shape[0]:
        _rmsnorm_kernel[(x.shape[0],)](
            x, residual if residual is not None else x, weight, out, new_residual, eps,
            N=x.shape[1], BLOCK=next_power_of_2(x.shape[1]), HAS_RESIDUAL=residual is not None,
        )
    return out, new_residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # [N, hidden]
    """Triton RMSNorm of x [N, hidden] with weight [hidden]."""
    require_triton("rms_norm")
    _check_inputs(x, None, weight)
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor,  # [N, hidden]
    residual: torch.Tensor,  # [N, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed [N, hidden], new residual [N, hidden])
    """Triton: (rms_norm(x + residual), x + residual) in one pass."""
    require_triton("fused_add_rms_norm")
    _check_inputs(x, residual, weight)
    return _launch(x, residual, weight, eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain torch, the math of ssd/layers/norm.py."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rms_norm_reference(summed, weight, eps), summed
