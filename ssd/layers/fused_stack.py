"""All decoder layers of a model as one call of the CPU layer ops, for decode and chain-verify forwards.

`FusedDecoderLayer` (ssd/layers/fused_layer.py) makes each layer one call; a model of 30 layers still pays the Python
between them (module dispatch, each layer's checks, argument marshalling) 30 times a step. `FusedDecoderStack` hands
the layers' fused forms to the extension's DecoderStack, which runs them in order in C++ exactly as the model's loop
would, so the result is the same bits. Where any layer has no fused form for a forward, it returns None and the
model runs its loop (which then fuses what it can, layer by layer).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import torch

from ssd.layers import cpu_kernels
from ssd.layers.fused_layer import (
    DecoderParts,
    FusedDecoderLayer,
    Watched,
    fused_forward,
    read_watched,
    unchanged,
)


class FusableLayer(Protocol):
    """What the stack reads of a decoder layer (a model's LlamaDecoderLayer)."""

    fused: FusedDecoderLayer | None

    def parts(self) -> DecoderParts: ...


@dataclass(frozen=True)
class _Built:
    """One DecoderStack and what it was built from: the objects it read, where they live, and the layers' KV caches."""

    watched: Watched
    objects: tuple[object, ...]
    stack: object
    kv_caches: list[torch.Tensor]

    def current(self) -> bool:
        """Whether every object is still the one the stack was built from (one pass over plain dicts)."""
        return unchanged(self.objects, self.watched)


class FusedDecoderStack:
    """The extension's DecoderStack over a model's layers, per activation dtype and row regime, built again when a
    layer's weights, KV cache or fused form are replaced."""

    def __init__(self) -> None:
        self._built: dict[tuple[torch.dtype, bool], _Built] = {}

    def __call__(self, layers: Sequence[FusableLayer], positions: torch.Tensor, x: torch.Tensor,
                 aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None:
        """(the last layer's delta, the residual stream before it, the stream entering each layer of `aux_layers`)
        for the embeddings x [T, d], or None where the stack does not serve this forward."""
        served = fused_forward(x, positions)
        if served is None:
            return None
        ops, ctx, meta = served
        key = (x.dtype, x.shape[0] <= cpu_kernels.MAX_ROWS)
        built = self._built.get(key)
        if built is None or not built.current():
            built = self._built[key] = _build(ops, layers, x)
        if built.stack is None:
            return None
        out = built.stack.forward(x.contiguous(), positions, built.kv_caches, ctx.slot_mapping, meta.kv_slots,
                                  meta.seq_lens, meta.num_queries, list(aux_layers))
        return out[0], out[1], out[2:]

    def __getstate__(self) -> dict[str, object]:  # the extension's objects do not pickle; they are built again
        return {"_built": {}}

    def __deepcopy__(self, memo: dict[int, object]) -> "FusedDecoderStack":
        return FusedDecoderStack()


def _build(ops: ModuleType, layers: Sequence[FusableLayer], x: torch.Tensor) -> _Built:
    """The stack for x's dtype and row count (its `stack` None where a layer has no fused form for it)."""
    watched: list[tuple[dict[str, object], str]] = []
    fused: list[object | None] = []
    kv_caches: list[torch.Tensor] = []
    for layer in layers:
        watched.append((layer.__dict__, "fused"))
        if layer.fused is None:
            fused.append(None)
            continue
        parts = layer.parts()
        watched += [*parts.watched, (parts.attn.__dict__, "kv_cache")]
        fused.append(layer.fused.layer(ops, parts, x))
        kv_caches.append(parts.attn.kv_cache)
    stack = None if any(f is None for f in fused) else ops.DecoderStack(fused)
    return _Built(watched, read_watched(watched), stack, kv_caches)
