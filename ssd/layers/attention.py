"""Paged attention: write new K/V into the paged cache, then attend over each sequence's slots.

The cache is head-major, [2, KVH, num_slots, D] per layer, so gathering a batch's slots gives
[KVH, B, S, D] blocks that batched matmuls read in place (a slot-major cache needed a transpose copy
after the gather, which cost more than the gather itself at large batch). The CPU path is plain torch
(gather + matmuls or scaled_dot_product_attention). A kernel plugs in by replacing `paged_attention`
for the devices it supports; the reference stays for the others.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ssd.context import ForwardContext, get_forward_context


def store_kv(
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    kv_cache: torch.Tensor,  # [2, KVH, num_slots, D]
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    kv_cache[0].index_copy_(1, slot_mapping, k.transpose(0, 1).to(kv_cache.dtype))
    kv_cache[1].index_copy_(1, slot_mapping, v.transpose(0, 1).to(kv_cache.dtype))


# Up to this many queries per sequence (decode, verify, tree steps) plain matmuls beat torch's CPU
# SDPA kernel by ~10x in bf16 (measured: B=8, S=300, Q=1: 0.36 ms vs 3.8 ms); prefill uses SDPA.
MAX_MATMUL_QUERIES = 16

# Attention reads keys in multiples of this, the padding masked out. On CPU, oneDNN builds a new bf16
# matmul primitive for every new key count (measured here: ~1.4 ms against ~0.08 ms for a reused one), and
# a decoding sequence's key count grows every step: bucketed, a primitive is built once per 64 positions.
KEY_BUCKET = 64


def bucketed(num_keys: int) -> int:
    """`num_keys` rounded up to a multiple of KEY_BUCKET (the key count attention reads)."""
    return -(-num_keys // KEY_BUCKET) * KEY_BUCKET


def head_major_attention(
    q: torch.Tensor,  # [B, Q, H, D]
    k: torch.Tensor,  # [KVH, B, S, D]
    v: torch.Tensor,  # [KVH, B, S, D]
    mask: torch.Tensor | None,  # [B|1, 1, Q, S] bool, True = may attend
    scale: float,
) -> torch.Tensor:  # [B, Q, H, D]
    """Grouped-query attention as two batched matmuls over (KVH, B); scores and softmax in float32.

    Head-major keys make every [S, D] block contiguous, so the matmuls read them in place."""
    b, nq, h, d = q.shape
    kvh = k.shape[0]
    g = h // kvh  # query heads per KV head; head i reads KV head i // g
    qh = q.view(b, nq, kvh, g, d).permute(2, 0, 3, 1, 4).reshape(kvh, b, g * nq, d)  # [KVH, B, G*Q, D]
    scores = (qh @ k.transpose(-1, -2)).float().view(kvh, b, g, nq, -1) * scale  # [KVH, B, G, Q, S]
    if mask is not None:
        scores = scores.masked_fill(~mask[None], float("-inf"))  # mask [1, B, 1, Q, S]
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(kvh, b, g * nq, -1)  # [KVH, B, G*Q, S]
    out = (probs @ v).view(kvh, b, g, nq, d)  # [KVH, B, G, Q, D]
    return out.permute(1, 3, 0, 2, 4).reshape(b, nq, h, d)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    kv_cache: torch.Tensor,  # [2, KVH, num_slots, D]
    ctx: ForwardContext,
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Reference path: pad queries per sequence, gather each sequence's keys, one batched attention."""
    num_seqs, num_keys = ctx.kv_slots.shape
    _, kvh, num_slots, d = kv_cache.shape
    flat = kv_cache.view(2 * kvh, num_slots, d)  # gathering along dim 1 of a 3-D view is ~2x faster than of 4-D
    kv = flat.index_select(1, ctx.kv_slots.view(-1)).view(2, kvh, num_seqs, num_keys, d)  # [2, KVH, B, S, D]
    uniform = ctx.query_index is None
    qp = q.view(num_seqs, -1, *q.shape[1:]) if uniform else q[ctx.query_index]  # [B, Q, H, D]
    if qp.shape[1] <= MAX_MATMUL_QUERIES:
        out = head_major_attention(qp, kv[0], kv[1], ctx.attn_mask, scale)  # [B, Q, H, D]
    else:
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2), kv[0].transpose(0, 1), kv[1].transpose(0, 1), attn_mask=ctx.attn_mask,
            scale=scale, enable_gqa=qp.shape[2] != kvh,
        ).transpose(1, 2)  # [B, Q, H, D]
    return out.reshape(q.shape) if uniform else out[ctx.token_batch, ctx.token_offset]  # [T, H, D]


class Attention(nn.Module):
    """Attention over the paged KV cache; the runner binds `kv_cache` before use."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.kv_cache = torch.empty(0)  # [2, KVH, num_slots, D], bound by the runner

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
        store_kv(k, v, self.kv_cache, ctx.slot_mapping)
        out = paged_attention(q, self.kv_cache, ctx, self.scale)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)
