"""Paged attention: write new K/V into the paged cache, then attend over each sequence's slots.

The cache is head-major, [2, KVH, num_slots, D] per layer, so gathering a batch's slots gives
[KVH, B, S, D] blocks that batched matmuls read in place (a slot-major cache needed a transpose copy
after the gather, which cost more than the gather itself at large batch). The forward context's backend
(ssd/layers/attention_backend.py) runs the attention; `paged_attention` here is the plain-torch reference.
Under torch.compile the layer calls the custom op `ssd::paged_attention`, opaque to the compiler: the
compiled graph holds the linears, norms and RoPE, and attention reads the forward context eagerly.
"""

import itertools
import weakref
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ssd.context import get_forward_context
from ssd.layers import cpu_kernels
from ssd.layers.attention_backend import KEY_BUCKET, FewQueries, PaddedBatch, bucketed

if TYPE_CHECKING:
    from ssd.layers.rotary import RotaryEmbedding

__all__ = ["KEY_BUCKET", "Attention", "bucketed", "paged_attention", "store_kv"]


def store_kv(
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    kv_cache: torch.Tensor,  # [2, KVH, num_slots, D]
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    ops = cpu_kernels.layer_ops_for(k)
    if (ops is not None and k.dtype == v.dtype == kv_cache.dtype and kv_cache.is_contiguous()
            and slot_mapping.dtype == torch.int64 and _heads_contiguous(k) and _heads_contiguous(v)):
        ops.store_kv(k, v, kv_cache, slot_mapping)  # one call; the rows of k and v may be strided
        return
    kv_cache[0].index_copy_(1, slot_mapping, k.transpose(0, 1).to(kv_cache.dtype))
    kv_cache[1].index_copy_(1, slot_mapping, v.transpose(0, 1).to(kv_cache.dtype))


def _heads_contiguous(t: torch.Tensor) -> bool:  # t [T, heads, D]: each token's heads side by side
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


# Up to this many queries per sequence (decode, verify, tree steps) plain matmuls beat torch's CPU
# SDPA kernel by ~10x in bf16 (measured: B=8, S=300, Q=1: 0.36 ms vs 3.8 ms); prefill uses SDPA.
MAX_MATMUL_QUERIES = 16


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
    batch: PaddedBatch,
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Reference path: pad queries per sequence, gather each sequence's keys, one batched attention."""
    num_seqs, num_keys = batch.kv_slots.shape
    _, kvh, num_slots, d = kv_cache.shape
    flat = kv_cache.view(2 * kvh, num_slots, d)  # gathering along dim 1 of a 3-D view is ~2x faster than of 4-D
    kv = flat.index_select(1, batch.kv_slots.view(-1)).view(2, kvh, num_seqs, num_keys, d)  # [2, KVH, B, S, D]
    uniform = batch.query_index is None
    qp = q.view(num_seqs, -1, *q.shape[1:]) if uniform else q[batch.query_index]  # [B, Q, H, D]
    if qp.shape[1] <= MAX_MATMUL_QUERIES:
        out = head_major_attention(qp, kv[0], kv[1], batch.mask, scale)  # [B, Q, H, D]
    else:
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2), kv[0].transpose(0, 1), kv[1].transpose(0, 1), attn_mask=batch.mask,
            scale=scale, enable_gqa=qp.shape[2] != kvh,
        ).transpose(1, 2)  # [B, Q, H, D]
    return out.reshape(q.shape) if uniform else out[batch.token_batch, batch.token_offset]  # [T, H, D]


_keys = itertools.count()
_layers: "weakref.WeakValueDictionary[int, Attention]" = weakref.WeakValueDictionary()  # for the custom op


class Attention(nn.Module):
    """Attention over the paged KV cache; the runner binds `kv_cache` before use."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.kv_cache = torch.empty(0)  # [2, KVH, num_slots, D], bound by the runner
        self.op_key = next(_keys)  # how the compiled graph's custom op finds this layer
        _layers[self.op_key] = self

    def attend(
        self,
        q: torch.Tensor,  # [N, H*D]: N >= T rows, the rows past the context's T are a compiled graph's padding
        k: torch.Tensor,  # [N, KVH*D]
        v: torch.Tensor,  # [N, KVH*D]
    ) -> torch.Tensor:  # [N, H*D]
        ctx = get_forward_context()
        rows, num_tokens = q.shape[0], ctx.num_tokens
        q = q[:num_tokens].view(num_tokens, self.num_heads, self.head_dim)
        k = k[:num_tokens].view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v[:num_tokens].view(num_tokens, self.num_kv_heads, self.head_dim)
        store_kv(k, v, self.kv_cache, ctx.slot_mapping)
        out = ctx.backend.attend(q, self.kv_cache, ctx, self.scale).reshape(num_tokens, -1)  # [T, H*D]
        return out if rows == num_tokens else F.pad(out, (0, 0, 0, rows - num_tokens))

    def rope_attend(self, positions: torch.Tensor, qkv: torch.Tensor, rope: "RotaryEmbedding") -> torch.Tensor | None:
        """RoPE, store and attend from the fused projection qkv [T, (H + 2 KVH) D] in one call of the CPU layer op,
        where the forward is few alike queries per sequence (the cpu backend's FewQueries) -> [T, H D]; None
        elsewhere (the caller applies `rope` and calls this layer)."""
        if torch.compiler.is_compiling():
            return None
        ctx = get_forward_context()
        ops = cpu_kernels.layer_ops_for(qkv)
        if (ops is None or not isinstance(ctx.attn_metadata, FewQueries) or qkv.shape[0] != ctx.num_tokens
                or qkv.stride(1) != 1 or qkv.dtype != self.kv_cache.dtype or positions.dtype != torch.int64
                or self.head_dim % 8 or rope.cos.device.type != "cpu"):
            return None
        meta = ctx.attn_metadata
        return ops.rope_attention(qkv, positions, rope.cos, rope.sin, self.kv_cache, ctx.slot_mapping, meta.kv_slots,
                                  meta.seq_lens, meta.num_queries, self.num_heads, self.num_kv_heads, self.scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.ssd.paged_attention(q, k, v, self.op_key)
        return self.attend(q, k, v)


@torch.library.custom_op("ssd::paged_attention", mutates_args=())
def _paged_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, op_key: int) -> torch.Tensor:
    """Layer `op_key`'s attention (stores the new K/V in its cache, which the graph never sees)."""
    return _layers[op_key].attend(q, k, v)


@_paged_attention_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, op_key: int) -> torch.Tensor:
    return torch.empty_like(q)
