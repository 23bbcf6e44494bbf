"""All-reduce and all-gather through shared memory, for tensor-parallel ranks that are processes on one machine.

A gloo collective over localhost TCP costs ~0.3 ms (measured here, 2 ranks, 576 bf16 values), and a decode
forward of a 30-layer model makes 62 of them. Here each rank copies its tensor into its own slot of a shared
mapping, raises its round counter, waits until every rank's counter has reached the round, then sums (or
concatenates) the slots in rank order, so every rank gets the same bits. Two slot banks alternate between
rounds: a rank can start writing round r + 1 only after all ranks raised their counters for round r, which each
did after it finished reading round r - 1, the last round that used that bank.

The data copy and the counter store are ordinary stores; x86's total store order makes a peer that sees the
counter see the data too. Other architectures do not promise that, so `supported()` is false there and the
ranks use gloo. Tensors larger than a slot go through gloo as well (all ranks decide alike: same shapes).
"""

import mmap
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

SLOT_BYTES = 4 << 20  # one rank's tensor per round: a decode step's [B, d] hidden states, or a logits shard
CACHE_LINE = 64
SPINS = 2000  # busy-wait polls (~0.3 ms) before yielding the core: ranks on cores of their own arrive sooner
YIELD_S = 1.0  # then yield the core (ranks sharing cores) for this long; after it, sleep 1 ms and check the peers


def supported() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def mapping_size(size: int) -> int:
    return CACHE_LINE * size + 2 * size * SLOT_BYTES


class SharedMemoryCollectives:
    """One rank's view of the shared mapping at `path` (rank 0 creates it; every rank maps it, then it can go)."""

    def __init__(self, path: Path, rank: int, size: int, create: bool, peers_alive: Callable[[], bool],
                 timeout_s: float, own_core: bool = True) -> None:
        """`own_core`: each rank has a core of its own, so waiting spins first; ranks that share cores yield at once
        (a spinning rank would hold the core its late peer needs)."""
        self.rank, self.size = rank, size
        self.spins = SPINS if own_core else 0
        self.peers_alive, self.timeout_s = peers_alive, timeout_s
        total = mapping_size(size)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, total)
            self._map = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self.counters = np.ndarray((size, CACHE_LINE // 8), dtype=np.int64, buffer=self._map)  # [size, 8]: col 0
        banks = torch.frombuffer(self._map, dtype=torch.uint8, offset=CACHE_LINE * size, count=2 * size * SLOT_BYTES)
        self.banks = banks.view(2, size, SLOT_BYTES)  # [bank, rank, bytes]
        self.round = int(self.counters[rank, 0])

    def fits(self, x: torch.Tensor) -> bool:
        return x.numel() * x.element_size() <= SLOT_BYTES

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Publish x; once every rank has, each rank's tensor (views into the shared slots), in rank order."""
        self.round += 1
        bank = self.banks[self.round & 1]  # [size, SLOT_BYTES]
        nbytes = x.numel() * x.element_size()
        slots = [bank[r, :nbytes].view(x.dtype).view(x.shape) for r in range(self.size)]
        slots[self.rank].copy_(x)
        self.counters[self.rank, 0] = self.round
        self._wait(self.round)
        return slots

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x := the sum over ranks (in rank order, the same bits on every rank)."""
        slots = self._exchange(x)
        x.copy_(slots[0])
        for other in slots[1:]:
            x.add_(other)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(x.contiguous()), dim=-1)

    def _wait(self, round_: int) -> None:
        """Until every rank has published `round_`: spin, then yield the core, then sleep and check the peers."""
        started = time.perf_counter()
        for peer in range(self.size):
            spins = 0
            while self.counters[peer, 0] < round_:
                spins += 1
                if spins < self.spins:
                    continue
                waited = time.perf_counter() - started
                if waited < YIELD_S:
                    os.sched_yield()
                    continue
                time.sleep(0.001)
                if spins % 64 == 0:
                    self._check(waited)

    def _check(self, waited: float) -> None:
        if not self.peers_alive():
            raise RuntimeError("a tensor-parallel peer exited in the middle of a collective")
        if waited > self.timeout_s:
            raise RuntimeError(f"a tensor-parallel peer did not reach the collective within {self.timeout_s:.0f} s")

    def close(self) -> None:
        self.banks = torch.empty(0, dtype=torch.uint8)
        del self.counters
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with the process
            pass
