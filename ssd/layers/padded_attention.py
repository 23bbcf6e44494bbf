"""The torch attention path, the reference the other backends are tested against: each sequence's keys gathered
through their slots and padded to the batch's longest (PaddedBatch, built once per forward by `padded_batch`), then
grouped-query attention as two batched matmuls (few queries per sequence) or torch's SDPA (prefill).

Its helpers serve the other backends too: `key_slots` (the KV slot of every key position), `ragged_index`, and the
key bucketing that keeps oneDNN from building a new matmul primitive every step.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ssd.context import ForwardContext
from ssd.layers.mask_bits import mask_bits

# Attention reads keys in multiples of this, the padding masked out. On CPU, oneDNN builds a new bf16
# matmul primitive for every new key count (measured here: ~1.4 ms against ~0.08 ms for a reused one), and
# a decoding sequence's key count grows every step: bucketed, a primitive is built once per 64 positions.
KEY_BUCKET = 64


def bucketed(num_keys: int) -> int:
    """`num_keys` rounded up to a multiple of KEY_BUCKET (the key count attention reads)."""
    return -(-num_keys // KEY_BUCKET) * KEY_BUCKET


def ragged_index(lengths: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b repeated lengths[b] times, and the index inside its row: both [total] (total = lengths.sum())."""
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=total)
    starts = torch.cumsum(lengths, 0) - lengths  # [B]
    return rows, torch.arange(total, device=lengths.device) - starts[rows]


def key_slots(ctx: ForwardContext, num_keys: int) -> torch.Tensor:
    """[B, S] int64, C-contiguous: the KV slot of key position s < S = num_keys of every sequence (past a
    sequence's blocks: its last). On CPU with numpy over the block tables' memory: at a decode step the same
    arithmetic as torch ops costs more in dispatch than in work."""
    bs, tables = ctx.block_size, ctx.block_tables
    if tables.device.type == "cpu":
        key = np.arange(num_keys)  # [S]
        block = np.minimum(key // bs, tables.shape[1] - 1)  # [S]
        return torch.from_numpy(np.take(tables.numpy(), block, axis=1).astype(np.int64) * bs + key % bs)
    key = torch.arange(num_keys, device=tables.device)  # [S]
    block = (key // bs).clamp(max=tables.shape[1] - 1)
    return tables[:, block].to(torch.int64) * bs + key % bs


@dataclass(frozen=True)
class PaddedBatch:
    """The torch path's view of a forward: queries padded to [B, Q], keys gathered to [B, S], a dense mask."""

    kv_slots: torch.Tensor  # [B, S] int64: KV slot of each key (S = bucketed max_seq_len; padding reads block 0)
    mask: torch.Tensor  # [B, 1, Q, S] bool, True = may attend
    query_index: torch.Tensor | None  # [B, Q] int64 flat row of each padded query; None when is_uniform
    token_batch: torch.Tensor | None  # [T] int64 sequence of each flat row; None when is_uniform
    token_offset: torch.Tensor | None  # [T] int64 column of each flat row in query_index; None when is_uniform


def padded_batch(ctx: ForwardContext) -> PaddedBatch:
    """Build the torch path's gather indices and mask from the kernel fields, with tensor ops on the device."""
    dev = ctx.seq_lens.device
    num_seqs, num_q, num_keys = ctx.seq_lens.numel(), ctx.max_query_len, bucketed(ctx.max_seq_len)
    key = torch.arange(num_keys, device=dev)  # [S]
    kv_slots = key_slots(ctx, num_keys)  # [B, S]
    seq_lens = ctx.seq_lens.to(torch.int64)
    col = torch.arange(num_q, device=dev)  # [Q]
    if ctx.is_uniform and ctx.tree_mask is None:  # decode / equal verify: no padding rows, a few ops fewer
        bound = (seq_lens - num_q)[:, None] + col[None, :] + 1  # [B, Q]: query i sees keys < bound
        return PaddedBatch(kv_slots, (key < bound[:, :, None]).unsqueeze(1), None, None, None)
    qsl = ctx.query_start_loc.to(torch.int64)
    q_len = qsl[1:] - qsl[:-1]  # [B]
    is_query = col[None, :] < q_len[:, None]  # [B, Q]: a real query, not padding
    query_index = (qsl[:-1, None] + col[None, :]).clamp(max=ctx.num_tokens - 1)  # [B, Q]
    if ctx.tree_mask is None:  # causal: query i sees keys < seq_len - q_len + i + 1
        mask = key[None, None, :] < (seq_lens - q_len)[:, None, None] + col[None, :, None] + 1  # [B, Q, S]
    else:
        start = ctx.mask_start.to(torch.int64)[:, None, None]  # [B, 1, 1]
        rel = (key[None, None, :] - start).clamp(min=0).expand(num_seqs, num_q, num_keys)  # [B, Q, S]
        bits = mask_bits(ctx.tree_mask[query_index], rel)  # [B, Q, S]
        mask = (key < start) | (bits & (key < seq_lens[:, None, None]))
    mask = (mask & is_query[:, :, None]) | ((key == 0) & ~is_query[:, :, None])  # padding queries see key 0
    if ctx.is_uniform:
        return PaddedBatch(kv_slots, mask.unsqueeze(1), None, None, None)
    token_batch, token_offset = ragged_index(q_len, ctx.num_tokens)  # [T] each
    return PaddedBatch(kv_slots, mask.unsqueeze(1), query_index, token_batch, token_offset)


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
