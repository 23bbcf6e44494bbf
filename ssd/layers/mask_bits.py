"""Token-tree attention masks packed 32 keys to an int32 word (the paged-attention kernel's `tree_mask` format).

Bit i of row t (word i // 32, least significant bit first) says whether query t sees the i-th key of its window.
`ssd_kernels.paged_attention.pack_mask` is the kernel package's equivalent; this one keeps ssd free of that import.
"""

import numpy as np
import torch

BITS = 32


def num_words(window: int) -> int:
    return -(-window // BITS)


def pack_mask(dense: torch.Tensor, words: int | None = None) -> torch.Tensor:
    """dense [T, window] bool -> [T, words] int32 (words defaults to the fewest that hold the window)."""
    num_rows, window = dense.shape
    words = num_words(window) if words is None else words
    if dense.device.type == "cpu":  # numpy packs the bits in one call (the torch ops below are ~0.1 ms a mask)
        bits = np.zeros((num_rows, words * BITS), dtype=bool)
        bits[:, :window] = dense.numpy()
        return torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view("<i4").astype(np.int32))
    padded = torch.zeros(num_rows, words * BITS, dtype=torch.int64, device=dense.device)
    padded[:, :window] = dense
    weights = torch.ones(BITS, dtype=torch.int64, device=dense.device) << torch.arange(BITS, device=dense.device)
    packed = (padded.view(num_rows, words, BITS) * weights).sum(-1)  # [T, words] in [0, 2^32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # two's complement wrap


def mask_bits(tree_mask: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """tree_mask [..., W] int32, rel [..., S] int64 key index in the window (>= 0) -> [..., S] bool."""
    word = (rel // BITS).clamp(max=tree_mask.shape[-1] - 1)
    bits = tree_mask.gather(-1, word)  # [..., S]
    return ((bits >> (rel % BITS).to(torch.int32)) & 1).bool() & (rel < tree_mask.shape[-1] * BITS)
