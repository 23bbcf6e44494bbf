"""Tensor parallelism: the rank a model is built for, and the collectives its parallel layers call.

A model is sharded when it is built inside `tensor_parallel(tp)`: every parallel layer records the
`TensorParallel` current at its construction and uses that group in each forward. A model built outside
(a draft model or EAGLE-3 head in the same process as a sharded target) is whole, at size 1.

The group is a torch.distributed process group made directly from a store (`ProcessGroupGloo` on CPU),
not torch's global default group, so a process can hold a sharded target and whole drafts side by side.
Ranks on one x86 machine also share a memory mapping (ssd/shared_memory_collectives.py) that carries every
collective whose tensor fits a slot, ~50x faster than gloo over localhost TCP; bigger tensors take gloo.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup over the `size` ranks; None at size 1
    shared: Any = None  # SharedMemoryCollectives of this rank, or None (gloo only)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum a partial result over the ranks, in place (no-op at size 1)."""
        if self.size == 1:
            return x
        if self.shared is not None and self.shared.fits(x):
            return self.shared.all_reduce(x)
        self.group.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the last dim, in rank order (`x` itself at size 1)."""
        if self.size == 1:
            return x
        if self.shared is not None and self.shared.fits(x):
            return self.shared.all_gather_last(x)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.group.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)


WHOLE = TensorParallel()
_current: list[TensorParallel] = [WHOLE]


@contextmanager
def tensor_parallel(tp: TensorParallel) -> Iterator[TensorParallel]:
    """Models built inside are sharded for `tp`."""
    _current.append(tp)
    try:
        yield tp
    finally:
        _current.pop()


def current_tp() -> TensorParallel:
    return _current[-1]


def divide(n: int, d: int, what: str = "") -> int:
    """n / d for a dimension split across d ranks; a clear error where it does not divide."""
    if n % d:
        name = f"{what} ({n})" if what else str(n)
        raise ValueError(f"{name} is not divisible by the tensor-parallel size {d}")
    return n // d
