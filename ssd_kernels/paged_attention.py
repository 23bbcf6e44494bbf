"""Attention of new queries over the paged KV cache, read in place through the block table.

One kernel serves decode (1 query per sequence), multi-query verify (causal among the new queries) and tree /
SSD-branch steps (a packed bit mask, see ssd_kernels/packed_mask.py). A program owns one (sequence, KV head,
row chunk, key split): its rows are the G = H / KVH query heads times the sequence's new queries, so every K/V
tile loaded serves all query heads sharing it (GQA). Keys stream in tiles with an online softmax in float32;
when the batch is too small to fill the GPU, the keys are split (flash-decoding) and the splits combined.
Queries are packed ragged ([T, H, D] with query_start_loc); seq_lens count every key including the new ones.
"""

import functools
from dataclasses import dataclass

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
from ssd_kernels.packed_mask import BITS_PER_WORD

LOG2_E = 1.4426950408889634

if HAS_TRITON:

    @triton.jit
    def _tree_visible(tree_mask_ptr, stride_mt, num_words, token, row_ok, keys, key_ok, mask_start):
        """[rows, keys] bool: keys before mask_start, and window keys whose bit is set in the row's words."""
        rel = keys - mask_start  # bit index inside the window
        in_window = (rel >= 0) & key_ok & (rel < num_words * 32)
        word_mask = row_ok[:, None] & in_window[None, :]
        words = tl.load(tree_mask_ptr + token[:, None].to(tl.int64) * stride_mt + (rel // 32)[None, :],
                        mask=word_mask, other=0)  # [rows, keys] int32
        bit = (words >> (rel % 32)[None, :]) & 1  # arithmetic shift: right for bit 31 too
        return ((keys < mask_start) & key_ok)[None, :] | (word_mask & (bit != 0))

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, mask_start_ptr, tree_mask_ptr,
        scale_log2e, num_row_chunks, tiles_per_split, num_words,
        stride_qt, stride_qh, stride_kh, stride_ks, stride_vh, stride_vs,
        stride_os, stride_ot, stride_oh, stride_ls, stride_lt, stride_bt, stride_mt,
        G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, HAS_TREE: tl.constexpr, IS_SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    ):
        b = tl.program_id(0)
        kv_head = (tl.program_id(1) // num_row_chunks).to(tl.int64)  # int64: kv_head * stride_kh > 2^31
        chunk = tl.program_id(1) % num_row_chunks
        split = tl.program_id(2)
        q_start = tl.load(query_start_loc_ptr + b)
        q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
        seq_len = tl.load(seq_lens_ptr + b)
        num_context = seq_len - q_len  # keys before the new queries

        rows = chunk * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = query (r // G), head (r % G) of this KV head
        query = rows // G
        row_ok = query < q_len
        token = q_start + query  # [BLOCK_M] flat token index
        head = (kv_head * G + rows % G).to(tl.int32)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < D
        q_offs = token[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :]
        q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)

        if HAS_TREE:
            kv_end = seq_len
            mask_start = tl.load(mask_start_ptr + b)
        else:  # causal: the chunk's last query sees keys < num_context + its index + 1
            kv_end = num_context + tl.minimum(q_len - 1, (chunk * BLOCK_M + BLOCK_M - 1) // G) + 1
        tile_lo = split * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, tl.cdiv(kv_end, BLOCK_N))

        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite, so rows that see no key stay NaN-free
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for tile in range(tile_lo, tile_hi):
            keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
            key_ok = keys < kv_end
            block = tl.load(block_tables_ptr + b * stride_bt + keys // BLOCK_SIZE, mask=key_ok, other=0)
            slot = block.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE
            kv_mask = key_ok[:, None] & dim_ok[None, :]
            k = tl.load(k_ptr + kv_head * stride_kh + slot[:, None] * stride_ks + dims[None, :], mask=kv_mask,
                        other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2e  # [BLOCK_M, BLOCK_N]
            if HAS_TREE:
                visible = _tree_visible(tree_mask_ptr, stride_mt, num_words, token, row_ok, keys, key_ok,
                                        mask_start)
            else:
                visible = keys[None, :] < (num_context + query + 1)[:, None]
            visible = visible & row_ok[:, None]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]; 0 where masked
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + kv_head * stride_vh + slot[:, None] * stride_vs + dims[None, :], mask=kv_mask,
                        other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
            m_i = m_new

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that saw no key gives zeros
        out_offs = token[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :]
        out_mask = row_ok[:, None] & dim_ok[None, :]
        if IS_SPLIT:  # partial result of this key split, combined by _combine_splits
            tl.store(out_ptr + split * stride_os + out_offs, out, mask=out_mask)
            lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))  # log2 domain
            tl.store(lse_ptr + split * stride_ls + token.to(tl.int64) * stride_lt + head, lse, mask=row_ok)
        else:
            tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=out_mask)


def _check_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, block_size,
                  mask_start, tree_mask, num_splits) -> None:
    check_ndim("q", q, 3, "[T, H, D]")
    check_ndim("k_cache", k_cache, 3, "[KVH, num_slots, D]")
    check_dtype("q", q, FLOAT_DTYPES)
    check_dtype("k_cache", k_cache, (q.dtype,))
    check_dtype("v_cache", v_cache, (q.dtype,))
    check_shape("v_cache", v_cache, tuple(k_cache.shape), "[KVH, num_slots, D] like k_cache")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    if k_cache.shape[2] != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)}: head dims must match and "
                         "H must be a multiple of KVH")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    check_ndim("block_tables", block_tables, 2, "[B, max_blocks]")
    num_seqs = block_tables.shape[0]
    for name, t, shape in (("seq_lens", seq_lens, (num_seqs,)), ("query_start_loc", query_start_loc,
                                                                  (num_seqs + 1,))):
        check_shape(name, t, shape, "[B]" if name == "seq_lens" else "[B+1]")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens),
                    ("query_start_loc", query_start_loc)):
        check_dtype(name, t, (torch.int32,))
        check_contiguous(name, t)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1 or None, got {num_splits}")
    if max_query_len < 1 or block_size < 1:
        raise ValueError(f"max_query_len ({max_query_len}) and block_size ({block_size}) must be >= 1")
    if (mask_start is None) != (tree_mask is None):
        raise ValueError("mask_start and tree_mask go together: pass both or neither")
    if tree_mask is not None:
        check_shape("mask_start", mask_start, (num_seqs,), "[B]")
        check_ndim("tree_mask", tree_mask, 2, "[T, W]")
        if tree_mask.shape[0] != num_tokens or tree_mask.shape[1] < 1:
            raise ValueError(f"tree_mask must be [T={num_tokens}, W>=1], got {tuple(tree_mask.shape)}")
        for name, t in (("mask_start", mask_start), ("tree_mask", tree_mask)):
            check_dtype(name, t, (torch.int32,))
            check_contiguous(name, t)
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                   query_start_loc=query_start_loc)
    if tree_mask is not None:
        tensors |= dict(mask_start=mask_start, tree_mask=tree_mask)
    check_same_device(**tensors)
    if q.device.type != "cuda" and not is_interpreting():
        raise ValueError(f"paged_attention runs on CUDA tensors (or under TRITON_INTERPRET=1), "
                         f"got {q.device}")


@dataclass(frozen=True)
class _LaunchPlan:
    block_m: int  # rows per program: G * queries, padded to a power of two >= 16 (tl.dot), at most 64
    block_n: int  # keys per tile: 64, or 32 for heads wider than 64 (registers)
    num_row_chunks: int  # programs along the rows of one (sequence, KV head)
    num_splits: int  # programs along the keys (flash-decoding); partial results are combined after
    tiles_per_split: int


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _plan(num_seqs: int, num_kv_heads: int, rows: int, head_dim: int, max_keys: int, device: torch.device,
          num_splits: int | None) -> _LaunchPlan:
    """Tiles and grid for `rows` = G * max_query_len rows per (sequence, KV head), `max_keys` per table."""
    block_m, block_n = min(64, max(16, next_power_of_2(rows))), 64 if head_dim <= 64 else 32
    num_row_chunks = -(-rows // block_m)
    num_tiles = -(-max_keys // block_n)
    if num_splits is None:  # on a GPU, about two programs per SM, each over at least 4 key tiles
        programs = num_seqs * num_kv_heads * num_row_chunks
        fill = -(-2 * _num_sms(device) // programs) if device.type == "cuda" else 1
        num_splits = max(1, min(fill, num_tiles // 4))
    tiles_per_split = -(-num_tiles // num_splits)
    return _LaunchPlan(block_m, block_n, num_row_chunks, -(-num_tiles // tiles_per_split), tiles_per_split)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [KVH, num_slots, D]
    v_cache: torch.Tensor,  # [KVH, num_slots, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, keys per sequence including its new tokens
    query_start_loc: torch.Tensor,  # [B+1] int32, cu_seqlens of the new tokens
    max_query_len: int,
    scale: float,
    *,
    block_size: int,
    mask_start: torch.Tensor | None = None,  # [B] int32
    tree_mask: torch.Tensor | None = None,  # [T, W] int32 packed bits
    num_splits: int | None = None,  # key splits; None = chosen for the GPU
) -> torch.Tensor:  # [T, H, D], q's dtype
    """Triton paged attention (see the module docstring); causal among the new queries without a tree mask."""
    require_triton("paged_attention")
    _check_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len, block_size,
                  mask_start, tree_mask, num_splits)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_seqs = k_cache.shape[0], block_tables.shape[0]
    if num_tokens == 0:
        return torch.empty_like(q)
    group = num_heads // num_kv_heads
    plan = _plan(num_seqs, num_kv_heads, group * max_query_len, head_dim, block_tables.shape[1] * block_size,
                 q.device, num_splits)
    splits = plan.num_splits
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [T, H, D]
    if splits > 1:
        partial = torch.empty(splits, num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(splits, num_tokens, num_heads, dtype=torch.float32, device=q.device)
    else:
        partial, lse = out[None], out[None, :, :, 0]  # written straight to `out`; lse unused
    has_tree = tree_mask is not None
    words = tree_mask if has_tree else seq_lens  # a placeholder pointer when there is no tree
    _paged_attention_kernel[(num_seqs, num_kv_heads * plan.num_row_chunks, splits)](
        q, k_cache, v_cache, partial, lse,
        block_tables, seq_lens, query_start_loc, mask_start if has_tree else seq_lens, words,
        scale * LOG2_E, plan.num_row_chunks, plan.tiles_per_split, words.shape[-1] if has_tree else 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1),
        block_tables.stride(0), tree_mask.stride(0) if has_tree else 0,
        G=group, D=head_dim, BLOCK_D=max(16, next_power_of_2(head_dim)), BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, BLOCK_SIZE=block_size, HAS_TREE=has_tree, IS_SPLIT=splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # tf32 holds bf16 / fp16 inputs exactly
        num_warps=4,
    )
    if splits > 1:
        out.copy_(_combine_splits(partial, lse))
    return out


def _combine_splits(
    partial: torch.Tensor,  # [splits, T, H, D] float32, each split's normalized output
    lse: torch.Tensor,  # [splits, T, H] float32, log2-sum-exp2 of each split's scores (-inf: no key)
) -> torch.Tensor:  # [T, H, D] float32
    top = lse.amax(0)  # [T, H]
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weight = torch.exp2(lse - top)  # [splits, T, H]
    total = weight.sum(0).clamp_min(torch.finfo(torch.float32).tiny)  # [T, H]
    return (weight[..., None] * partial).sum(0) / total[..., None]


def _visible_keys(
    seq_lens: torch.Tensor,  # [B]
    q_lens: torch.Tensor,  # [B]
    tokens: torch.Tensor,  # [B, Q] flat token index of each padded query
    num_keys: int,
    mask_start: torch.Tensor | None,  # [B]
    tree_mask: torch.Tensor | None,  # [T, W]
) -> torch.Tensor:  # [B, Q, S] bool
    keys = torch.arange(num_keys, device=seq_lens.device)  # [S]
    key_ok = keys[None, :] < seq_lens[:, None]  # [B, S]
    if tree_mask is None:
        queries = torch.arange(tokens.shape[1], device=seq_lens.device)  # [Q]
        last_visible = (seq_lens - q_lens)[:, None] + queries[None, :]  # [B, Q]
        return (keys[None, None, :] <= last_visible[:, :, None]) & key_ok[:, None, :]
    window = tree_mask.shape[1] * BITS_PER_WORD
    rel = keys[None, :] - mask_start.long()[:, None]  # [B, S] bit index inside the window
    in_window = (rel >= 0) & (rel < window) & key_ok
    rel = rel.clamp(0, window - 1)
    words = tree_mask.long()[tokens]  # [B, Q, W]
    picked = words.gather(2, (rel // BITS_PER_WORD)[:, None, :].expand(-1, tokens.shape[1], -1))  # [B, Q, S]
    bit = ((picked >> (rel % BITS_PER_WORD)[:, None, :]) & 1).bool()
    return ((keys[None, :] < mask_start.long()[:, None]) & key_ok)[:, None, :] | (in_window[:, None, :] & bit)


def paged_attention_reference(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [KVH, num_slots, D]
    v_cache: torch.Tensor,  # [KVH, num_slots, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    query_start_loc: torch.Tensor,  # [B+1] int32
    max_query_len: int,
    scale: float,
    *,
    block_size: int,
    mask_start: torch.Tensor | None = None,  # [B] int32
    tree_mask: torch.Tensor | None = None,  # [T, W] int32
    num_splits: int | None = None,  # accepted for the same signature; unused
) -> torch.Tensor:  # [T, H, D]
    """Plain torch: gather each sequence's keys through its block table, mask, attend in float32."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_seqs = k_cache.shape[0], block_tables.shape[0]
    if num_tokens == 0:
        return torch.empty_like(q)
    group = num_heads // num_kv_heads
    starts = query_start_loc[:-1].long()  # [B]
    q_lens = query_start_loc[1:].long() - starts  # [B]
    if int(q_lens.max()) > max_query_len:
        raise ValueError(f"a sequence has {int(q_lens.max())} new queries, more than "
                         f"max_query_len={max_query_len}")
    seq_lens = seq_lens.long()
    num_keys = max(1, int(seq_lens.max()))
    keys = torch.arange(num_keys, device=q.device)  # [S]
    column = (keys // block_size).clamp(max=block_tables.shape[1] - 1)
    slots = block_tables.long()[:, column] * block_size + keys % block_size  # [B, S]
    slots = torch.where(keys[None, :] < seq_lens[:, None], slots, 0)  # padding keys read slot 0, masked below
    k = k_cache[:, slots].float()  # [KVH, B, S, D]
    v = v_cache[:, slots].float()
    queries = torch.arange(max_query_len, device=q.device)  # [Q]
    is_query = queries[None, :] < q_lens[:, None]  # [B, Q]
    tokens = torch.where(is_query, starts[:, None] + queries[None, :], 0)  # [B, Q]
    qh = q[tokens].float().view(num_seqs, max_query_len, num_kv_heads, group, head_dim)
    qh = qh.permute(2, 0, 3, 1, 4)  # [KVH, B, G, Q, D]
    visible = _visible_keys(seq_lens, q_lens, tokens, num_keys, mask_start, tree_mask)  # [B, Q, S]
    scores = (qh @ k[:, :, None].transpose(-1, -2)) * scale  # [KVH, B, G, Q, S]
    scores = scores.masked_fill(~visible[None, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query that sees no key gets zeros
    out = (probs @ v[:, :, None]).permute(1, 3, 0, 2, 4)  # [B, Q, KVH, G, D]
    return out.reshape(num_seqs, max_query_len, num_heads, head_dim)[is_query].to(q.dtype)  # [T, H, D]
