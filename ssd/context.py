"""The forward context: everything attention needs about one forward, published for its duration.

The model runner builds one frozen `ForwardContext` per forward and enters `forward_context(ctx)`;
attention layers read it with `get_forward_context()`. Model code never sees batching details.
The fields are the paged-attention kernel's arguments (vLLM-style varlen metadata): no dense mask is built on
the host. Causal and verify masks follow from `seq_lens` and `query_start_loc`; only token trees bring a mask,
as a compact bit mask per query over the keys from `mask_start` on.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch


class ForwardMode(Enum):
    PREFILL = "prefill"  # new prompt tokens (possibly after a cached prefix)
    DECODE = "decode"  # one new token per sequence
    VERIFY = "verify"  # several new tokens per sequence, causal among themselves (speculation)
    TREE = "tree"  # new tokens with an explicit attention mask (token trees, fan-out branches)


@dataclass(frozen=True)
class ForwardContext:
    mode: ForwardMode
    num_tokens: int  # T: real new tokens; a compiled graph may run on more rows (padding), attention ignores them
    slot_mapping: torch.Tensor  # [T] int64: KV slot each new token is written to
    block_tables: torch.Tensor  # [B, max_blocks] int32: each sequence's KV blocks (0 where padding)
    seq_lens: torch.Tensor  # [B] int32: keys each sequence attends over, new tokens included
    query_start_loc: torch.Tensor  # [B + 1] int32: sequence b's new tokens are rows [qsl[b], qsl[b+1]) of T
    max_query_len: int  # new tokens of the longest sequence
    max_seq_len: int  # keys of the longest sequence
    block_size: int  # tokens per KV block: slot = block_id * block_size + offset
    is_uniform: bool  # every sequence brings max_query_len new tokens: the T rows reshape to [B, Q] as they are
    # Token trees only (None = causal): query t of sequence b sees key j iff j < mask_start[b], or
    # mask_start[b] <= j < seq_lens[b] and bit (j - mask_start[b]) of tree_mask[t] is set (word w = bits
    # 32w..32w+31, least significant first).
    mask_start: torch.Tensor | None = None  # [B] int32
    tree_mask: torch.Tensor | None = None  # [T, W] int32 packed bits
    backend: Any = None  # the AttentionBackend that runs this forward's attention (ssd/layers/attention_backend.py)
    attn_metadata: Any = None  # what that backend derived once per forward from the fields above (on the device)


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
