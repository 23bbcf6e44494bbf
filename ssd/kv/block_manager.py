"""Paged KV block bookkeeping: reference counts, chained-hash prefix caching, rollback by length.

A sequence owns a block table (block ids in position order). A block whose tokens all have
committed KV gets a hash chained from its predecessor's; a later sequence with the same token
prefix reuses it (tokens are compared too, so a collision never shares wrong KV). Freed blocks
keep their hash until reallocated, so a finished request's prefix stays reusable, LRU first out.
"""

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol


def block_hash(previous: int, chunk: tuple[int, ...]) -> int:
    """The chained hash of a full block: its tokens and its predecessor's hash (0 for the first block). Python
    hashes tuples of ints the same in every process, so a draft keys its own prefix cache by the target's hashes."""
    return hash((previous, chunk))


class PagedSequence(Protocol):
    """What the block manager needs of a sequence."""

    block_table: list[int]
    num_cached_tokens: int  # tokens at the front whose KV is computed and committed
    num_hashed_blocks: int  # leading blocks already registered in the prefix cache

    @property
    def token_ids(self) -> list[int]: ...


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.num_prefix_hit_blocks = 0  # blocks reused from the prefix cache, ever

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def slot(self, seq: PagedSequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    # -- allocation -------------------------------------------------------------------------
    def _take_free(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def _lookup(self, h: int, tokens: tuple[int, ...]) -> int | None:
        block_id = self.hash_to_block.get(h)
        if block_id is None or self.blocks[block_id].token_ids != tokens:
            return None
        return block_id

    def can_allocate(self, seq: PagedSequence) -> bool:
        return self.blocks_for(len(seq.token_ids)) <= self.num_free_blocks

    def allocate(self, seq: PagedSequence, reuse_prefix: bool = True) -> None:
        """Give a new (or preempted) sequence blocks for all its tokens, reusing cached prefix blocks unless
        `reuse_prefix` is False (every token then gets computed, e.g. to score the prompt)."""
        if seq.block_table:
            raise RuntimeError("allocate() on a sequence that already holds blocks")
        tokens = seq.token_ids
        bs = self.block_size
        # never reuse the block holding the last token: its logits must be computed
        num_reusable = (len(tokens) - 1) // bs if self.enable_prefix_caching and reuse_prefix else 0
        h = 0
        for i in range(num_reusable):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = block_hash(h, chunk)
            block_id = self._lookup(h, chunk)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_blocks[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            self.num_prefix_hit_blocks += 1
        seq.num_cached_tokens = len(seq.block_table) * bs
        seq.num_hashed_blocks = len(seq.block_table)
        self.ensure_capacity(seq, len(tokens))

    def can_grow(self, seq: PagedSequence, num_tokens: int) -> bool:
        """Whether the sequence's table can be grown to hold `num_tokens` tokens."""
        return self.blocks_for(num_tokens) - len(seq.block_table) <= self.num_free_blocks

    def ensure_capacity(self, seq: PagedSequence, num_tokens: int) -> None:
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_free())

    def free(self, seq: PagedSequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block_id] = None
        seq.block_table = []
        seq.num_cached_tokens = 0
        seq.num_hashed_blocks = 0

    # -- commit and rollback ----------------------------------------------------------------
    def commit(self, seq: PagedSequence) -> None:
        """Register every block whose tokens now all have committed KV in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        tokens = seq.token_ids
        h = self.blocks[seq.block_table[seq.num_hashed_blocks - 1]].hash if seq.num_hashed_blocks else 0
        for i in range(seq.num_hashed_blocks, seq.num_cached_tokens // bs):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            h = block_hash(h, chunk)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = h, chunk
            self.hash_to_block[h] = block.block_id
            seq.num_hashed_blocks = i + 1

    def truncate(self, seq: PagedSequence, num_tokens: int) -> None:
        """Roll back: keep blocks for the first `num_tokens` tokens, free the rest."""
        keep = self.blocks_for(num_tokens)
        if keep < seq.num_hashed_blocks:
            raise RuntimeError("cannot roll back into committed, hashed blocks")
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block_id] = None
        del seq.block_table[keep:]
        seq.num_cached_tokens = min(seq.num_cached_tokens, num_tokens)
