"""Every query row of a ragged or tree-masked forward as a one-query sequence with its own visible keys.

The CPU attention op takes B sequences of Q alike causal queries each (the cpu backend's FewQueries): a decode
step or a chain verify of equal lengths. Sequences that bring different numbers of new tokens (a catch-up next to
a verify, SSD's glue) and token trees (SD tree verifies, SSD's branch steps) do not have that shape, and took the
torch path: a padded key gather, a dense mask and ~20 small ops per layer. Given each query row its own list of
key slots (the keys it may see, in key order), every such forward has it, with Q = 1: the op reads a row's first
seq_len keys. The lists are built once per forward on the host with numpy from the forward context's fields: the
visibility rule of the torch path's mask (`padded_batch`), computed again here because compacting that mask with
torch ops cost 2.3x as much per tree step (0.6 vs 0.26 ms at batch 1); a test holds the two paths equal.
"""

import numpy as np
import torch

from ssd.context import ForwardContext


def query_rows(ctx: ForwardContext, seq_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """seq_slots [B, S] int64 (the KV slot of each key of each sequence, S = ctx.max_seq_len) -> (kv_slots [T, S']
    int64: each query row's visible key slots in key order, padded with slot 0; seq_lens [T] int64: how many), or
    None where a row would see no key (the torch path handles that forward)."""
    slots = seq_slots.numpy()
    qsl = ctx.query_start_loc.numpy().astype(np.int64)
    q_len = np.diff(qsl)  # [B]
    seq_lens = ctx.seq_lens.numpy().astype(np.int64)  # [B]
    row_seq = np.repeat(np.arange(len(q_len)), q_len)  # [T]: the sequence of each query row
    row_index = np.arange(ctx.num_tokens) - qsl[:-1][row_seq]  # [T]: its index among its sequence's queries
    if ctx.tree_mask is None:  # causal: row i sees the keys before the sequence's new ones and new ones 0..i
        visible_count = seq_lens[row_seq] - q_len[row_seq] + row_index + 1  # [T]
        return torch.from_numpy(slots[row_seq]), torch.from_numpy(visible_count)
    visible = _tree_visible(ctx, row_seq, seq_lens[row_seq], slots.shape[1])  # [T, S]
    counts = visible.sum(1)  # [T]
    if counts.min(initial=1) < 1:
        return None
    out = np.zeros((ctx.num_tokens, int(counts.max())), dtype=np.int64)  # [T, S']
    rows, keys = np.nonzero(visible)  # row-major: each row's keys in increasing order
    out[rows, np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)] = slots[row_seq[rows], keys]
    return torch.from_numpy(out), torch.from_numpy(counts.astype(np.int64))


def _tree_visible(ctx: ForwardContext, row_seq: np.ndarray, row_len: np.ndarray, num_keys: int) -> np.ndarray:
    """[T, S] bool: the keys each query row may see. Keys before its sequence's mask_start are seen by every query
    of it; from there on, bit (key - mask_start) of the row's packed tree_mask says (never past its seq_len)."""
    words = np.ascontiguousarray(ctx.tree_mask.numpy(), dtype="<i4")  # [T, W] packed 32 keys a word, LSB first
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").astype(bool)  # [T, 32 W]
    start = ctx.mask_start.numpy().astype(np.int64)[row_seq]  # [T]
    key = np.arange(num_keys)  # [S]
    rel = key[None, :] - start[:, None]  # [T, S]: index in the row's window
    in_window = (rel >= 0) & (rel < bits.shape[1]) & (key[None, :] < row_len[:, None])
    shown = np.take_along_axis(bits, np.clip(rel, 0, bits.shape[1] - 1), axis=1)  # [T, S]
    return (rel < 0) | (in_window & shown)
