"""Paged attention: write new K/V into the paged cache, then attend over each sequence's slots.

The CPU path is plain torch (gather + scaled_dot_product_attention). A kernel plugs in by
replacing `paged_attention` for the devices it supports; the reference stays for the others.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ssd.context import ForwardContext, get_forward_context


def store_kv(
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    k_cache: torch.Tensor,  # [num_slots, KVH, D]
    v_cache: torch.Tensor,  # [num_slots, KVH, D]
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    k_cache.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [num_slots, KVH, D]
    v_cache: torch.Tensor,  # [num_slots, KVH, D]
    ctx: ForwardContext,
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Reference path: pad queries per sequence, gather each sequence's keys, one batched SDPA."""
    qp = q[ctx.query_index].transpose(1, 2)  # [B, H, Q, D]
    kp = k_cache[ctx.kv_slots].transpose(1, 2)  # [B, KVH, S, D]
    vp = v_cache[ctx.kv_slots].transpose(1, 2)  # [B, KVH, S, D]
    out = F.scaled_dot_product_attention(
        qp, kp, vp, attn_mask=ctx.attn_mask, scale=scale, enable_gqa=qp.shape[1] != kp.shape[1]
    )  # [B, H, Q, D]
    return out.transpose(1, 2)[ctx.token_batch, ctx.token_offset]  # [T, H, D]


class Attention(nn.Module):
    """Attention over the paged KV cache; the runner binds `k_cache` / `v_cache` before use."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(
        self,
        q: torch.Tensor,  # [T, H*D]
        k: torch.Tensor,  # [T, KVH*D]
        v: torch.Tensor,  # [T, KVH*D]
    ) -> torch.Tensor:  # [T, H*D]
        ctx = get_forward_context()
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        store_kv(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        out = paged_attention(q, self.k_cache, self.v_cache, ctx, self.scale)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)
