"""A forward's inputs, built with batched tensor ops into buffers allocated once (vLLM / SGLang style).

The host work of a step is concatenating the items' lists once (token ids, block tables, lengths); everything
else (positions, KV slots, padded block tables, query offsets) is computed by a handful of tensor ops on the
model's device, into buffers that only grow. No attention mask is built here: causal and verify masks follow
from `seq_lens` / `query_start_loc` in the attention backend; a token tree's dense mask becomes a packed bit
mask over the keys from its first partly visible one (`mask_start`).
"""

from dataclasses import dataclass
from itertools import chain

import torch

from ssd.context import ForwardContext, ForwardMode
from ssd.layers.attention_backend import ragged_index
from ssd.layers.mask_bits import num_words, pack_mask


@dataclass(frozen=True)
class ForwardItem:
    token_ids: list[int]  # the new tokens this sequence feeds
    start_position: int  # physical KV position of the first new token (= tokens already in KV)
    block_table: list[int]  # the sequence's KV blocks, covering start_position + len(token_ids)
    num_logits: int = 1  # logits wanted for the last `num_logits` new tokens (0: a prompt chunk only fills KV)
    positions: list[int] | None = None  # RoPE positions of the new tokens; None = physical positions
    attn_mask: torch.Tensor | None = None  # [n, start_position + n] bool, True = may attend; None = causal


def compact_tree_mask(items: list[ForwardItem], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """mask_start [B] int32 and tree_mask [T, W] int32 for a batch where some item brings a dense mask.

    mask_start is where an item's keys stop being visible to all of its queries (never past its new tokens);
    causal items get their own lower triangle."""
    starts, windows = [], []
    for it, n in zip(items, lengths, strict=True):
        if it.attn_mask is None:
            starts.append(it.start_position)
            windows.append(torch.ones(n, n, dtype=torch.bool).tril())
            continue
        all_see = it.attn_mask.all(0).to(torch.int64)  # [total]: key visible to every query
        start = min(int(all_see.cumprod(0).sum()), it.start_position)
        starts.append(start)
        windows.append(it.attn_mask[:, start:].cpu())
    words = max(num_words(w.shape[1]) for w in windows)
    tree_mask = torch.cat([pack_mask(w, words) for w in windows])  # [T, W]
    return torch.tensor(starts, dtype=torch.int32), tree_mask


class StepInputs:
    """Builds `ForwardContext`s, input ids and positions for one model; owns the buffers they live in."""

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, size: int, dtype: torch.dtype) -> torch.Tensor:
        """The first `size` elements of buffer `name` (regrown to the next power of two when too small)."""
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < size:
            buf = torch.zeros(1 << max(size - 1, 0).bit_length(), dtype=dtype, device=self.device)
            self._buffers[name] = buf
        return buf[:size]

    def build(self, items: list[ForwardItem], mode: ForwardMode,
              padded_tokens: int | None = None) -> tuple[ForwardContext, torch.Tensor, torch.Tensor]:
        """The forward context plus input ids and positions [padded_tokens or T] (padding rows repeat old ids)."""
        dev, bs = self.device, self.block_size
        lengths = [len(it.token_ids) for it in items]
        tables = [it.block_table for it in items]
        num_seqs, num_tokens, max_blocks = len(items), sum(lengths), max(len(t) for t in tables)
        rows = padded_tokens or num_tokens
        per_seq = torch.tensor([lengths, [it.start_position for it in items], [len(t) for t in tables]])  # [3, B]
        q_len, start, num_blocks = per_seq.to(dev)  # [B] int64 each
        flat_tables = torch.tensor(list(chain.from_iterable(tables))).to(dev)  # [sum(num_blocks)]
        input_ids = self.buffer("input_ids", rows, torch.int64)
        input_ids[:num_tokens].copy_(torch.tensor(list(chain.from_iterable(it.token_ids for it in items))))

        qsl = self.buffer("query_start_loc", num_seqs + 1, torch.int32)
        qsl[0] = 0
        qsl[1:] = torch.cumsum(q_len, 0)
        seq_lens = self.buffer("seq_lens", num_seqs, torch.int32)
        seq_lens.copy_(start + q_len)
        table_rows, table_cols = ragged_index(num_blocks, flat_tables.numel())
        block_tables = self.buffer("block_tables", num_seqs * max_blocks, torch.int32).view(num_seqs, max_blocks)
        block_tables.zero_()
        block_tables[table_rows, table_cols] = flat_tables.to(torch.int32)

        token_seq, token_col = ragged_index(q_len, num_tokens)  # [T]
        physical = start[token_seq] + token_col  # [T]: KV position of each new token
        slot_mapping = self.buffer("slot_mapping", num_tokens, torch.int64)
        torch.add(block_tables[token_seq, physical // bs].to(torch.int64) * bs, physical % bs, out=slot_mapping)
        positions = self.buffer("positions", rows, torch.int64)
        positions[:num_tokens] = physical
        self._apply_positions(items, lengths, positions)
        mask_start = tree_mask = None
        if any(it.attn_mask is not None for it in items):
            mask_start, tree_mask = (t.to(dev) for t in compact_tree_mask(items, lengths))
        ctx = ForwardContext(
            mode=mode, num_tokens=num_tokens, slot_mapping=slot_mapping, block_tables=block_tables,
            seq_lens=seq_lens, query_start_loc=qsl, max_query_len=max(lengths),
            max_seq_len=max(it.start_position + n for it, n in zip(items, lengths, strict=True)),
            block_size=bs, is_uniform=len(set(lengths)) == 1, mask_start=mask_start, tree_mask=tree_mask,
        )
        return ctx, input_ids, positions

    @staticmethod
    def _apply_positions(items: list[ForwardItem], lengths: list[int], positions: torch.Tensor) -> None:
        """Overwrite the physical positions with the RoPE positions that tree items bring."""
        if all(it.positions is None for it in items):
            return
        offset = 0
        for it, n in zip(items, lengths, strict=True):
            if it.positions is not None:
                positions[offset : offset + n] = torch.tensor(it.positions)
            offset += n
