"""Write the new tokens' K/V into the paged cache at their slots (slot = block_id * block_size + offset).

A negative slot skips its token (padding rows of a captured batch). Values are cast to the cache dtype.
"""

import torch

from ssd_kernels._checks import (
    FLOAT_DTYPES,
    check_contiguous,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_same_device,
    check_shape,
)
from ssd_kernels._triton import HAS_TRITON, is_interpreting, next_power_of_2, require_triton, tl, triton

if HAS_TRITON:

    @triton.jit
    def _store_kv_kernel(
        k_ptr, v_ptr, cache_ptr, slot_mapping_ptr,
        stride_kt, stride_kh, stride_vt, stride_vh, stride_cache_kv, stride_ch, stride_cs,
        KVH: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_mapping_ptr + token)
        if slot >= 0:
            heads = tl.arange(0, BLOCK_H)
            dims = tl.arange(0, BLOCK_D)
            mask = (heads < KVH)[:, None] & (dims < D)[None, :]
            k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
            v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
            head_offs = heads[:, None].to(tl.int64) * stride_ch  # int64: can pass 2^31
            dst = cache_ptr + head_offs + slot * stride_cs + dims[None, :]  # [BLOCK_H, BLOCK_D]
            tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + stride_cache_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def _check_inputs(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    check_ndim("k", k, 3, "[T, KVH, D]")
    check_shape("v", v, tuple(k.shape), "[T, KVH, D] like k")
    check_ndim("kv_cache", kv_cache, 4, "[2, KVH, num_slots, D]")
    num_tokens, num_kv_heads, head_dim = k.shape
    if kv_cache.shape[0] != 2 or kv_cache.shape[1] != num_kv_heads or kv_cache.shape[3] != head_dim:
        raise ValueError(f"kv_cache must be [2, KVH={num_kv_heads}, num_slots, D={head_dim}], "
                         f"got {tuple(kv_cache.shape)}")
    for name, t in (("k", k), ("v", v), ("kv_cache", kv_cache)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_dim_contiguous(name, t)
    check_shape("slot_mapping", slot_mapping, (num_tokens,), "[T]")
    check_dtype("slot_mapping", slot_mapping, (torch.int64,))
    check_contiguous("slot_mapping", slot_mapping)
    check_same_device(k=k, v=v, kv_cache=kv_cache, slot_mapping=slot_mapping)
    if k.device.type != "cuda" and not is_interpreting():
        raise ValueError(f"store_kv runs on CUDA tensors (or under TRITON_INTERPRET=1), got {k.device}")


def store_kv(
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    kv_cache: torch.Tensor,  # [2, KVH, num_slots, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Triton: kv_cache[0][:, slot_mapping[t]] = k[t], kv_cache[1][:, slot_mapping[t]] = v[t] (in place)."""
    require_triton("store_kv")
    _check_inputs(k, v, kv_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k, v, kv_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        kv_cache.stride(2),
        KVH=num_kv_heads, D=head_dim, BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
    )


def store_kv_reference(
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    kv_cache: torch.Tensor,  # [2, KVH, num_slots, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Plain torch twin of `store_kv` (index_copy_ of the tokens whose slot is not negative)."""
    keep = slot_mapping >= 0  # [T]
    slots = slot_mapping[keep]
    kv_cache[0].index_copy_(1, slots, k[keep].transpose(0, 1).to(kv_cache.dtype))
    kv_cache[1].index_copy_(1, slots, v[keep].transpose(0, 1).to(kv_cache.dtype))
