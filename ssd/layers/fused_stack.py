"""All decoder layers of a model as one call of the CPU layer ops, for decode and chain-verify forwards.

`FusedDecoderLayer` (ssd/layers/fused_layer.py) makes each layer one call; a model of 30 layers still pays the Python
between them (module dispatch, each layer's checks, argument marshalling) 30 times a step. `FusedDecoderStack` hands
the layers' fused forms to the extension's DecoderStack, which runs them in order in C++ exactly as the model's loop
would, so the result is the same bits. Where any layer has no fused form for a forward, it returns None and the
model runs its loop (which then fuses what it can, layer by layer).
"""

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ssd.layers.fused_layer import fused_forward

if TYPE_CHECKING:
    from ssd.models.llama import LlamaDecoderLayer


class FusedDecoderStack:
    """The extension's DecoderStack over a model's layers, built again whenever one layer's fused form is."""

    def __init__(self) -> None:
        self._built: tuple[tuple[object, ...], object] | None = None

    def __call__(self, layers: Sequence["LlamaDecoderLayer"], positions: torch.Tensor, x: torch.Tensor,
                 aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None:
        """(the last layer's delta, the residual stream before it, the stream entering each layer of `aux_layers`)
        for the embeddings x [T, d], or None where the stack does not serve this forward."""
        served = fused_forward(x, positions)
        if served is None or any(layer.fused is None for layer in layers):
            return None
        ops, ctx, meta = served
        parts = [layer.parts() for layer in layers]
        fused = tuple(layer.fused.layer(ops, p, x) for layer, p in zip(layers, parts, strict=True))
        if any(f is None for f in fused):
            return None
        if self._built is None or len(self._built[0]) != len(fused) or not all(map(operator.is_, self._built[0], fused)):
            self._built = (fused, ops.DecoderStack(list(fused)))
        out = self._built[1].forward(x.contiguous(), positions, [p.attn.kv_cache for p in parts], ctx.slot_mapping,
                                     meta.kv_slots, meta.seq_lens, meta.num_queries, list(aux_layers))
        return out[0], out[1], out[2:]

    def __getstate__(self) -> dict[str, object]:  # the extension's objects do not pickle; they are built again
        return {"_built": None}

    def __deepcopy__(self, memo: dict[int, object]) -> "FusedDecoderStack":
        return FusedDecoderStack()
