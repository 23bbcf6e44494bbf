"""The forward context: everything attention needs about one forward, published for its duration.

The model runner builds one frozen `ForwardContext` per forward and enters `forward_context(ctx)`;
attention layers read it with `get_forward_context()`. Model code never sees batching details.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import torch


class ForwardMode(Enum):
    PREFILL = "prefill"  # new prompt tokens (possibly after a cached prefix)
    DECODE = "decode"  # one new token per sequence
    VERIFY = "verify"  # several new tokens per sequence, causal among themselves (speculation)
    TREE = "tree"  # new tokens with an explicit attention mask (token trees, fan-out branches)


@dataclass(frozen=True)
class ForwardContext:
    mode: ForwardMode
    slot_mapping: torch.Tensor  # [T] int64: KV slot each new token is written to
    kv_slots: torch.Tensor  # [B, S] int64: KV slots each sequence reads, in key order (0 where padding)
    attn_mask: torch.Tensor | None  # [B, 1, Q, S] bool, True = may attend; None = attend to every key
    # Padding of queries into [B, Q]; all three are None when every sequence brings the same number of
    # new tokens Q (decode, equal-length verify), so the flat tokens reshape to [B, Q] as they are.
    query_index: torch.Tensor | None  # [B, Q] int64: flat token index of each padded query (0 where padding)
    token_batch: torch.Tensor | None  # [T] int64: sequence (row of query_index) of each flat token
    token_offset: torch.Tensor | None  # [T] int64: column of query_index of each flat token


class _Published(threading.local):
    """The contexts published on this thread (a draft may run its forwards on a thread of its own while the
    target runs its own: each sees only its own context)."""

    def __init__(self) -> None:
        self.stack: list[ForwardContext] = []


_current = _Published()


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    _current.stack.append(ctx)
    try:
        yield ctx
    finally:
        _current.stack.pop()


def get_forward_context() -> ForwardContext:
    if not _current.stack:
        raise RuntimeError("attention ran outside forward_context(); the model runner must publish one")
    return _current.stack[-1]
