"""A forward's inputs, built on the host with numpy and copied once into buffers allocated once (vLLM style).

The host work of a step is concatenating the items' lists (token ids, block tables, lengths) and a handful of
vectorized numpy ops over them (positions, KV slots, padded block tables, query offsets); each result is then
copied into its buffer on the model's device, and the buffers only grow. No attention mask is built here: causal and verify masks follow
from `seq_lens` / `query_start_loc` in the attention backend; a token tree's dense mask becomes a packed bit
mask over the keys from its first partly visible one (`mask_start`).
"""

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from ssd.context import ForwardContext, ForwardMode
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
            windows.append(np.tri(n, dtype=bool))
            continue
        dense = it.attn_mask.cpu().numpy()  # [n, total]
        all_see = dense.all(0)  # [total]: key visible to every query
        start = min(int(all_see.argmin()) if not all_see.all() else all_see.size, it.start_position)
        starts.append(start)
        windows.append(dense[:, start:])
    words = max(num_words(w.shape[1]) for w in windows)
    tree_mask = torch.cat([pack_mask(torch.from_numpy(w), words) for w in windows])  # [T, W]
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
        host = _host_arrays(items, self.block_size)
        num_seqs, num_tokens = len(items), len(host.input_ids)
        rows = padded_tokens or num_tokens
        input_ids = self._fill("input_ids", rows, host.input_ids)
        qsl = self._fill("query_start_loc", num_seqs + 1, host.query_start_loc)
        seq_lens = self._fill("seq_lens", num_seqs, host.seq_lens)
        block_tables = self._fill("block_tables", host.block_tables.size, host.block_tables.reshape(-1))
        slot_mapping = self._fill("slot_mapping", num_tokens, host.slot_mapping)
        positions = self._fill("positions", rows, host.positions)
        self._apply_positions(items, host.lengths, positions)
        mask_start = tree_mask = None
        if any(it.attn_mask is not None for it in items):
            mask_start, tree_mask = (t.to(self.device) for t in compact_tree_mask(items, host.lengths))
        ctx = ForwardContext(
            mode=mode, num_tokens=num_tokens, slot_mapping=slot_mapping,
            block_tables=block_tables.view(host.block_tables.shape), seq_lens=seq_lens, query_start_loc=qsl,
            max_query_len=max(host.lengths), max_seq_len=int(host.seq_lens.max()), block_size=self.block_size,
            is_uniform=len(set(host.lengths)) == 1, mask_start=mask_start, tree_mask=tree_mask,
        )
        return ctx, input_ids, positions

    def _fill(self, name: str, size: int, values: np.ndarray) -> torch.Tensor:
        """Buffer `name`'s first `size` elements, the first len(values) of them set to `values` (one copy to the
        device; rows past them, a compiled graph's padding, keep what they held)."""
        buf = self.buffer(name, size, _TORCH_DTYPES[values.dtype.type])
        buf[: len(values)].copy_(torch.from_numpy(values))
        return buf

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


_TORCH_DTYPES = {np.int32: torch.int32, np.int64: torch.int64}


@dataclass(frozen=True)
class _HostArrays:
    """A forward's index arrays, computed on the host with numpy (a few microseconds for a decode batch, where
    the same work as torch ops cost ~0.15 ms of dispatch on CPU)."""

    lengths: list[int]  # [B] new tokens per item
    input_ids: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, max_blocks] int32, 0 where padding
    slot_mapping: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64 physical positions


def _host_arrays(items: list[ForwardItem], block_size: int) -> _HostArrays:
    lengths = [len(it.token_ids) for it in items]
    num_seqs, num_tokens = len(items), sum(lengths)
    q_len = np.array(lengths, dtype=np.int64)  # [B]
    start = np.array([it.start_position for it in items], dtype=np.int64)  # [B]
    qsl = np.zeros(num_seqs + 1, dtype=np.int32)
    np.cumsum(q_len, out=qsl[1:])
    tables = np.zeros((num_seqs, max(len(it.block_table) for it in items)), dtype=np.int32)  # [B, max_blocks]
    for row, it in zip(tables, items, strict=True):
        row[: len(it.block_table)] = it.block_table
    token_seq = np.repeat(np.arange(num_seqs), q_len)  # [T]
    physical = start[token_seq] + np.arange(num_tokens) - qsl[:-1][token_seq]  # [T]: KV position of each new token
    slots = tables[token_seq, physical // block_size].astype(np.int64) * block_size + physical % block_size  # [T]
    input_ids = np.fromiter(chain.from_iterable(it.token_ids for it in items), dtype=np.int64, count=num_tokens)
    return _HostArrays(lengths, input_ids, qsl, (start + q_len).astype(np.int32), tables, slots, physical)
