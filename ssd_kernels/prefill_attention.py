"""Causal attention of prompt tokens over their own keys (prefill), for packed ragged sequences.

Uses flash-attn's `flash_attn_varlen_func` where it is installed and the tensors are CUDA fp16 / bf16, else
torch's scaled_dot_product_attention per sequence. Queries may be fewer than keys (a prompt after a cached
prefix whose keys the caller gathered): query i of a sequence sees keys <= i + (num_keys - num_queries),
the bottom-right causal alignment flash-attn uses. A prefill over the paged cache can go through
ssd_kernels.paged_attention instead, which handles any number of queries per sequence.
"""

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ssd_kernels._checks import (
    FLOAT_DTYPES,
    check_contiguous,
    check_dtype,
    check_ndim,
    check_same_device,
    check_shape,
)


@functools.cache
def _flash_attn_varlen() -> Callable | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:  # the SDPA path serves instead
        return None
    return flash_attn_varlen_func


def has_flash_attn() -> bool:
    return _flash_attn_varlen() is not None


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k) -> None:
    check_ndim("q", q, 3, "[Tq, H, D]")
    check_ndim("k", k, 3, "[Tk, KVH, D]")
    check_shape("v", v, tuple(k.shape), "[Tk, KVH, D] like k")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, t, (q.dtype,) if name != "q" else FLOAT_DTYPES)
    if k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: head dims must match and H must be a "
                         "multiple of KVH")
    check_ndim("cu_seqlens_q", cu_seqlens_q, 1, "[B+1]")
    check_shape("cu_seqlens_k", cu_seqlens_k, tuple(cu_seqlens_q.shape), "[B+1] like cu_seqlens_q")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_dtype(name, t, (torch.int32,))
        check_contiguous(name, t)
    check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


def prefill_attention(
    q: torch.Tensor,  # [Tq, H, D]
    k: torch.Tensor,  # [Tk, KVH, D]
    v: torch.Tensor,  # [Tk, KVH, D]
    cu_seqlens_q: torch.Tensor,  # [B+1] int32
    cu_seqlens_k: torch.Tensor,  # [B+1] int32
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
) -> torch.Tensor:  # [Tq, H, D]
    """Causal varlen attention: flash-attn where it can run, else SDPA per sequence."""
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    flash = _flash_attn_varlen()
    if flash is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return flash(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=scale,
                     causal=True)
    out = torch.empty_like(q)
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        qs, qe, ks, ke = bounds_q[b], bounds_q[b + 1], bounds_k[b], bounds_k[b + 1]
        qb, kb, vb = (t.transpose(0, 1)[None] for t in (q[qs:qe], k[ks:ke], v[ks:ke]))  # [1, heads, L, D]
        same = qe - qs == ke - ks  # SDPA's is_causal aligns top-left, right only for square blocks
        mask = None if same else _causal_mask(qe - qs, ke - ks, q.device)
        out[qs:qe] = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, is_causal=same, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
        )[0].transpose(0, 1)
    return out


def _causal_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:  # [Lq, Lk] bool
    ones = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
    return ones.tril(diagonal=num_keys - num_queries)


def prefill_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, scale: float,
) -> torch.Tensor:  # [Tq, H, D]
    """Plain torch: per sequence, float32 scores, the bottom-right causal mask, softmax, weighted values."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        qs, qe, ks, ke = bounds_q[b], bounds_q[b + 1], bounds_k[b], bounds_k[b + 1]
        kb = k[ks:ke].float().repeat_interleave(group, dim=1)  # [Lk, H, D]
        vb = v[ks:ke].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[qs:qe].float(), kb) * scale  # [H, Lq, Lk]
        scores = scores.masked_fill(~_causal_mask(qe - qs, ke - ks, q.device), float("-inf"))
        out[qs:qe] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1).nan_to_num(0.0), vb).to(q.dtype)
    return out
