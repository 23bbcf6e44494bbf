"""Target features kept beside the paged KV, block for block, so prefix caching works with EAGLE-3 drafts.

An EAGLE-3 head drafts from the target's hidden states at every position of a sequence. When the prefix cache
serves a prompt's first blocks, the target computes no features for them; this store gives them back. Row
`position` of a sequence lives in block `block_table[position // block_size]`, like its KV, so a block the
prefix cache shares carries its features with it, and they stay valid as long as its KV does (a block's content
only changes after it leaves the cache and is reallocated, and then it is written again before it is read).
"""

import torch


class FeatureCache:
    """[num_blocks, block_size, F] target features; allocated on the first write (F, dtype and device from it)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.rows: torch.Tensor | None = None  # [num_blocks * block_size, F]

    def _slots(self, block_table: list[int], start: int, count: int, device: torch.device) -> torch.Tensor:
        positions = torch.arange(start, start + count)  # [count]
        table = torch.tensor(block_table, dtype=torch.long)
        return (table[positions // self.block_size] * self.block_size + positions % self.block_size).to(device)

    def write(self, block_table: list[int], start: int, features: torch.Tensor) -> None:
        """Store `features` [n, F] as the rows of positions start .. start + n - 1."""
        if self.rows is None:
            self.rows = torch.zeros(self.num_blocks * self.block_size, features.shape[1], dtype=features.dtype,
                                    device=features.device)
        slots = self._slots(block_table, start, len(features), self.rows.device)
        self.rows.index_copy_(0, slots, features.to(self.rows.dtype))

    def read(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """-> [end - start, F]: the rows of positions start .. end - 1 (written before, by this or a sharing sequence)."""
        if self.rows is None:
            raise RuntimeError("feature cache read before any write")
        return self.rows.index_select(0, self._slots(block_table, start, end - start, self.rows.device))

    @property
    def num_bytes(self) -> int:
        return 0 if self.rows is None else self.rows.numel() * self.rows.element_size()
