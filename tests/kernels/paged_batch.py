"""Random paged-attention batches for the kernel tests: shuffled blocks, ragged lengths, packed queries."""

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, H, D]
    kv_cache: torch.Tensor  # [2, KVH, num_slots, D]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B+1] int32
    max_query_len: int
    scale: float
    block_size: int

    def args(self) -> tuple:
        """The positional arguments of paged_attention / paged_attention_reference."""
        return (self.q, self.kv_cache[0], self.kv_cache[1], self.block_tables, self.seq_lens,
                self.query_start_loc, self.max_query_len, self.scale)

    def block_table(self, b: int) -> list[int]:
        num_blocks = -(-int(self.seq_lens[b]) // self.block_size)
        return self.block_tables[b, :num_blocks].tolist()


def make_batch(
    seq_lens: list[int], q_lens: list[int], *, num_kv_heads: int = 2, group: int = 1, head_dim: int = 16,
    block_size: int = 16, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    seed: int = 0,
) -> PagedBatch:
    """Sequences of `seq_lens` keys (the last `q_lens` of them the new tokens), on blocks drawn at random."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2  # spare blocks: keys outside a sequence's table must not leak in
    pool = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq)), -1, dtype=torch.int32)  # -1: never read
    used = 0
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = pool[used : used + n]
        used += n
    kv_cache = torch.randn(2, num_kv_heads, num_blocks * block_size, head_dim, generator=gen)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return PagedBatch(q=q.to(dtype).to(device), kv_cache=kv_cache.to(dtype).to(device),
                      block_tables=block_tables.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32,
                                                                                      device=device),
                      query_start_loc=starts.to(device), max_query_len=max(q_lens), scale=head_dim**-0.5,
                      block_size=block_size)


def ancestor_mask(parents: list[int], num_context: int) -> torch.Tensor:  # [n, num_context + n] bool
    """A token tree's mask: each node sees the context, itself and its ancestors (parent < i, -1: root)."""
    n = len(parents)
    mask = torch.zeros(n, num_context + n, dtype=torch.bool)
    mask[:, :num_context] = True
    for i, parent in enumerate(parents):
        mask[i, num_context + i] = True
        if parent >= 0:
            mask[i, num_context:] |= mask[parent, num_context:]
    return mask


def tree_cases() -> list[tuple[str, int, torch.Tensor]]:
    """(name, seq_len, dense mask [q_len, seq_len]) for token trees and SSD branch steps of several shapes."""
    from ssd.speculation.tree_mask import branch_mask

    gen = torch.Generator().manual_seed(1)
    random = torch.rand(12, 40, generator=gen) < 0.5
    random[torch.arange(12), 28 + torch.arange(12)] = True  # every query sees itself
    cases = [
        ("chain", ancestor_mask([-1, 0, 1, 2, 3, 4], 20)),
        ("wide", ancestor_mask([-1, 0, 0, 0, 0, 1, 1, 2, 3], 15)),
        ("ssd_branches", branch_mask(30, 4, [1, 4, 2, 3], 2)),  # window of 4 + 3 * 4 keys
        ("ssd_deep", branch_mask(17, 6, [1, 6, 3, 2, 5], 6)),  # window of 41 keys: two words, bit 31 in use
        ("random", random),
    ]
    return [(name, mask.shape[1], mask) for name, mask in cases]
