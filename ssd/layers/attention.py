"""Paged attention: write new K/V into the paged cache, then attend over each sequence's slots.

The cache is head-major, [2, KVH, num_slots, D] per layer, so gathering a batch's slots gives
[KVH, B, S, D] blocks that batched matmuls read in place (a slot-major cache needed a transpose copy
after the gather, which cost more than the gather itself at large batch). The forward context's backend
(ssd/layers/attention_backend.py) runs the attention; ssd/layers/padded_attention.py is the plain-torch reference.
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
from ssd.layers.attention_backend import FewQueries

if TYPE_CHECKING:
    from ssd.layers.rotary import RotaryEmbedding

__all__ = ["Attention", "store_kv"]


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
                                  meta.seq_lens, meta.num_queries, self.num_heads, self.num_kv_heads, self.scale,
                                  cpu_kernels.attention_path(qkv.dtype, self.head_dim))

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
