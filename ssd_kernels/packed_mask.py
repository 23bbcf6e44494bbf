"""The packed attention-mask format of paged attention's tree mode: a window of key bits per query.

Query t of sequence b sees key j iff `j < mask_start[b]`, or `mask_start[b] <= j < seq_len[b]` and bit
`j - mask_start[b]` of its row is set. A row is `W = ceil(window / 32)` int32 words; word w holds bits
32w..32w+31, least significant first, so bit 31 of a word is its sign bit (a word with it set is negative).
"""

import torch

BITS_PER_WORD = 32


def num_words(window: int) -> int:
    """Words per row for a window of `window` keys (at least one, so the tensor is never empty)."""
    return max(1, -(-window // BITS_PER_WORD))


def pack_mask(dense_mask: torch.Tensor) -> torch.Tensor:  # [T, W] int32
    """Pack `dense_mask` [T, window] bool (True = may attend) into [T, ceil(window / 32)] int32 words."""
    if dense_mask.dim() != 2 or dense_mask.dtype != torch.bool:
        raise ValueError(f"dense_mask must be [T, window] bool, got {tuple(dense_mask.shape)} "
                         f"{dense_mask.dtype}")
    t, window = dense_mask.shape
    width = num_words(window)
    bits = torch.zeros(t, width * BITS_PER_WORD, dtype=torch.int64, device=dense_mask.device)
    bits[:, :window] = dense_mask.to(torch.int64)
    weights = torch.arange(BITS_PER_WORD, device=dense_mask.device)  # [32]
    words = (bits.view(t, width, BITS_PER_WORD) << weights).sum(-1)  # [T, W] in [0, 2^32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # two's complement


def unpack_mask(words: torch.Tensor, window: int) -> torch.Tensor:  # [T, window] bool
    """The inverse of `pack_mask`: the first `window` bits of each row of `words` [T, W] int32."""
    bit = torch.arange(window, device=words.device)  # [window]
    picked = words.long()[:, bit // BITS_PER_WORD]  # [T, window]; int32 -> int64 keeps the sign bit's value
    return ((picked >> (bit % BITS_PER_WORD)) & 1).bool()


def pack_sequence_masks(masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense masks per sequence (ForwardItem.attn_mask, [n_b, seq_len_b] bool) -> (mask_start, tree_mask).

    mask_start [B] int32 is each sequence's longest prefix of keys that all its rows see; tree_mask
    [sum n_b, W] int32 packs the rest of every row, W sized for the widest window in the batch.
    """
    if not masks:
        raise ValueError("pack_sequence_masks needs at least one mask")
    starts, windows = [], []
    for m in masks:
        if m.dim() != 2 or m.dtype != torch.bool:
            raise ValueError(f"each mask must be [n, seq_len] bool, got {tuple(m.shape)} {m.dtype}")
        prefix = int(m.all(0).long().cumprod(0).sum())  # leading keys every row sees
        starts.append(prefix)
        windows.append(m[:, prefix:])
    width = max(w.shape[1] for w in windows)
    device = masks[0].device
    num_rows = sum(w.shape[0] for w in windows)
    dense = torch.zeros(num_rows, width, dtype=torch.bool, device=device)  # [T, window]
    row = 0
    for w in windows:
        dense[row : row + w.shape[0], : w.shape[1]] = w
        row += w.shape[0]
    return torch.tensor(starts, dtype=torch.int32, device=device), pack_mask(dense)
