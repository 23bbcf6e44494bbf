"""The EAGLE-3 head's own prefix cache: head KV and fused features, block for block, under the target's block hashes.

Head position j takes (g_j, embedding of x_{j+1}) (ssd/models/eagle3.py), so its KV row depends on tokens
x_0..x_{j+1}: one token past position j. Head block b therefore holds head positions b*bs - 1 .. (b+1)*bs - 2
(block 0: 0 .. bs - 2), whose inputs are exactly the tokens of target blocks 0..b, and is keyed by the target's
chained hash of those blocks (`block_hash`, ssd/kv/block_manager.py). A prompt whose first n blocks hit in the
target's prefix cache (N = n*bs tokens) gets head positions 0 .. N - 2 from here and needs target features from
position N - 1 on only.

Blocks are copied into a sequence's dense head KV when it starts (nothing is shared while a sequence runs, so
there is nothing to count references of); the cache holds at most `capacity` blocks, least recently used
evicted first. Tokens are compared on a lookup, so a hash collision never restores wrong KV.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from ssd.kv.block_manager import block_hash
from ssd.models.eagle3 import HeadKVCache


@dataclass(frozen=True)
class HeadBlock:
    token_ids: tuple[int, ...]  # the target block's tokens (compared on lookup)
    k: torch.Tensor  # [n, KVH, D] head keys of the block's head positions (n = bs - 1 for block 0, else bs)
    v: torch.Tensor  # [n, KVH, D]
    fused: torch.Tensor  # [n, d] fused target features g_j of those positions


@dataclass
class HeadPrefixCounters:
    num_query_positions: int = 0  # head positions asked of the cache (a new sequence's restorable prefix)
    num_hit_positions: int = 0  # of those, the ones restored from it


class HeadPrefixCache:
    def __init__(self, block_size: int, capacity: int) -> None:
        if block_size < 1 or capacity < 1:
            raise ValueError(f"a head prefix cache needs block_size >= 1 and capacity >= 1, got {block_size}, "
                             f"{capacity}")
        self.block_size = block_size
        self.capacity = capacity
        self.blocks: OrderedDict[int, HeadBlock] = OrderedDict()  # chained hash -> block, LRU first
        self.counters = HeadPrefixCounters()

    def _end(self, b: int) -> int:
        """The head position after head block b's last one."""
        return (b + 1) * self.block_size - 1

    def lookup(self, token_ids: list[int], max_positions: int) -> list[HeadBlock]:
        """The leading cached blocks of this token sequence covering at most `max_positions` head positions."""
        bs, h, found = self.block_size, 0, []
        self.counters.num_query_positions += max(max_positions, 0)
        b = 0
        while self._end(b) <= max_positions and (b + 1) * bs <= len(token_ids):
            chunk = tuple(token_ids[b * bs : (b + 1) * bs])
            h = block_hash(h, chunk)
            block = self.blocks.get(h)
            if block is None or block.token_ids != chunk:
                break
            self.blocks.move_to_end(h)
            found.append(block)
            b += 1
        self.counters.num_hit_positions += self._end(len(found) - 1) if found else 0
        return found

    def insert(self, token_ids: list[int], num_real: int, cache: HeadKVCache, fused: torch.Tensor) -> None:
        """Register every head block whose positions all have real head KV (`num_real` of them, in `cache`;
        `fused` [>= num_real, d]) and whose tokens are all committed (`token_ids`)."""
        bs, h = self.block_size, 0
        b = 0
        while self._end(b) <= num_real and (b + 1) * bs <= len(token_ids):
            chunk = tuple(token_ids[b * bs : (b + 1) * bs])
            h = block_hash(h, chunk)
            if h not in self.blocks:
                lo, hi = max(b * bs - 1, 0), self._end(b)
                self.blocks[h] = HeadBlock(chunk, cache.k[lo:hi].clone(), cache.v[lo:hi].clone(),
                                           fused[lo:hi].clone())
                if len(self.blocks) > self.capacity:
                    self.blocks.popitem(last=False)
            b += 1

    @staticmethod
    def restore(blocks: list[HeadBlock], cache: HeadKVCache) -> torch.Tensor:
        """Append the blocks' head KV to an empty `cache`; -> their fused features [n, d] (n = positions)."""
        if not blocks:
            raise ValueError("nothing to restore")
        cache.append(torch.cat([b.k for b in blocks]), torch.cat([b.v for b in blocks]))
        return torch.cat([b.fused for b in blocks])
