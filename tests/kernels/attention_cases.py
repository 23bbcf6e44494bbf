"""Few-query paged attention cases for the CPU attention ops' tests: a cache whose keys sit in scattered slots (or in
runs of consecutive ones, as a paged cache's blocks hold them), and the torch reference of the causal attention."""

import torch

from ssd.layers.padded_attention import head_major_attention


def attention_case(dtype, seq_lens, q, seed=4, heads=6, kv_heads=2, d=16, block=None):
    """A cache with scattered slots, or with blocks of `block` consecutive slots in scattered order; returns
    (queries [B * Q, H, D], cache, kv_slots [B, S], seq_lens)."""
    g = torch.Generator().manual_seed(seed)
    s = max(seq_lens)
    num_slots = max(256, 2 * len(seq_lens) * s)
    cache = torch.randn(2, kv_heads, num_slots, d, generator=g).to(dtype)
    if block is None:
        kv_slots = torch.stack([torch.randperm(num_slots, generator=g)[:s] for _ in seq_lens])  # [B, S]
    else:
        blocks = torch.randperm(num_slots // block, generator=g)  # each sequence's blocks, disjoint
        per_seq = -(-s // block)
        kv_slots = torch.stack([
            (blocks[b * per_seq : (b + 1) * per_seq, None] * block + torch.arange(block)).reshape(-1)[:s]
            for b in range(len(seq_lens))
        ])
    queries = torch.randn(len(seq_lens) * q, heads, d, generator=g).to(dtype)
    return queries, cache, kv_slots, torch.tensor(seq_lens)


def reference_attention(queries, cache, kv_slots, seq_lens, q, scale):
    """The torch path's causal attention of the last q queries of each sequence -> queries' shape."""
    b, s = kv_slots.shape
    kv = cache[:, :, kv_slots.view(-1)].view(2, cache.shape[1], b, s, -1)  # [2, KVH, B, S, D]
    key = torch.arange(s)
    mask = key < (seq_lens - q)[:, None, None] + torch.arange(q)[None, :, None] + 1  # [B, Q, S]
    out = head_major_attention(queries.view(b, q, *queries.shape[1:]), kv[0], kv[1], mask.unsqueeze(1), scale)
    return out.reshape(queries.shape)
