"""Tensor-parallel rank and world size; world size 1 unless torch.distributed was initialized."""

import torch.distributed as dist


def tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x):  # type: ignore[no-untyped-def]
    """Sum a partial result over the tensor-parallel group (no-op at world size 1)."""
    if tp_size() > 1:
        dist.all_reduce(x)
    return x
