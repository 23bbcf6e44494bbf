"""A whole pre-norm decoder layer as one call of the CPU layer ops, for forwards of few queries per sequence.

A Llama layer runs RMSNorm, the qkv projection, RoPE + the K/V store + attention, the output projection, RMSNorm,
gate-up, SiLU-and-multiply and down. On a small model at batch 1 the Python between those calls (module dispatch,
the checks of each layer op) cost about as much as the arithmetic. `FusedDecoderLayer` hands the layer's weights to
the extension's DecoderLayer once (ssd_kernels/cpu/decoder_layer.cpp), which calls the same functions in the same
order, so the result is the same bits as the layer's own forward with the layer ops on. It serves what the cpu
attention backend's FewQueries serves (decode, verifies, token trees, uneven batches); every other forward
(prefill, compiled graphs, training, ranks > 1, a linear that dequantizes per call) returns None and the layer runs
op by op.
"""

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from ssd.context import ForwardContext, get_forward_context
from ssd.layers import cpu_kernels
from ssd.layers.attention_backend import FewQueries

if TYPE_CHECKING:
    from ssd.layers.attention import Attention
    from ssd.layers.linear import _Linear
    from ssd.layers.norm import RMSNorm
    from ssd.layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class DecoderParts:
    """The modules of a pre-norm decoder layer whose weights the fused call reads."""

    input_norm: "RMSNorm"
    qkv: "_Linear"
    attn: "Attention"
    rope: "RotaryEmbedding"
    o: "_Linear"
    post_norm: "RMSNorm"
    gate_up: "_Linear"
    down: "_Linear"

    @cached_property
    def watched(self) -> tuple[tuple[dict[str, object], str], ...]:
        """Where each object the fused call is built from lives, as (the module's own dict, key): reading them is
        how a call notices that one was replaced (quantized, moved). The modules' own dicts, not attribute lookups:
        this runs for every layer of every step, and nn.Module's attribute lookup cost about 8% of a batch-1 step
        on the default model (docs/benchmarks.md)."""
        out: list[tuple[dict[str, object], str]] = [(self.input_norm._parameters, "weight"),
                                                    (self.post_norm._parameters, "weight"), (self.rope.__dict__, "cos")]
        for m in (self.qkv, self.o, self.gate_up, self.down):
            out += [(m._parameters, "weight"), (m.__dict__, "packed"), (m.__dict__, "own"), (m._modules, "quantized"),
                    (m._parameters, "bias")]
        return tuple(out)

    def weights(self) -> tuple[object, ...]:
        """Every object the fused call was built from: when one is replaced, it is built again."""
        return read_watched(self.watched)


Watched = Sequence[tuple[dict[str, object], str]]  # (a module's own dict, key) pairs


def read_watched(watched: Watched) -> tuple[object, ...]:
    """The objects at `watched` now (None where a key is gone)."""
    return tuple([where.get(key) for where, key in watched])


def unchanged(objects: Sequence[object], watched: Watched) -> bool:
    """Whether every object at `watched` is still the one in `objects` (read when a fused call was built)."""
    return all(map(operator.is_, objects, read_watched(watched)))


class FusedDecoderLayer:
    """The extension's DecoderLayer for one layer's parts, built on first use for each activation dtype and row
    regime (up to or over cpu_kernels.MAX_ROWS rows), and again whenever one of the parts' weights is replaced."""

    def __init__(self) -> None:
        self._built: dict[tuple[torch.dtype, bool], tuple[tuple[object, ...], object | None]] = {}

    def __call__(self, parts: DecoderParts, positions: torch.Tensor, x: torch.Tensor,
                 residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(this layer's delta, the residual stream before it) for x [T, d], or None where the call does not serve
        this forward (the caller runs the layer op by op)."""
        served = fused_forward(x, positions)
        if served is None or (residual is not None and residual.dtype != x.dtype):
            return None
        ops, ctx, meta = served
        layer = self.layer(ops, parts, x)
        if layer is None:
            return None
        delta, stream = layer.forward(x.contiguous(), None if residual is None else residual.contiguous(), positions,
                                      parts.attn.kv_cache, ctx.slot_mapping, meta.kv_slots, meta.seq_lens,
                                      meta.num_queries)
        return delta, stream

    def layer(self, ops: ModuleType, parts: DecoderParts, x: torch.Tensor) -> object | None:
        """The extension's DecoderLayer for x's dtype and row count, or None where the layer has no fused form."""
        built = self._layer(ops, parts, x.dtype, x.shape[0] <= cpu_kernels.MAX_ROWS)
        return None if built is None or parts.attn.kv_cache.dtype != x.dtype else built

    def _layer(self, ops: ModuleType, parts: DecoderParts, dtype: torch.dtype, few_rows: bool) -> object | None:
        built = self._built.get((dtype, few_rows))
        if built is not None and unchanged(built[0], parts.watched):
            return built[1]
        weights = parts.weights()
        layer = _build(ops, parts, dtype, few_rows)
        self._built[(dtype, few_rows)] = (weights, layer)
        return layer

    def __getstate__(self) -> dict[str, object]:  # the extension's objects do not pickle; they are built again
        return {"_built": {}}

    def __deepcopy__(self, memo: dict[int, object]) -> "FusedDecoderLayer":
        return FusedDecoderLayer()


def fused_forward(x: torch.Tensor, positions: torch.Tensor) -> tuple[ModuleType, ForwardContext, FewQueries] | None:
    """(the extension, the forward context, its attention metadata) where fused layers serve a forward of x [T, d],
    else None: no autograd, the layer ops on for x, and a few-query forward (decode, verify, tree) of all T tokens."""
    if torch.is_grad_enabled():  # training: the call has no backward
        return None
    ops = cpu_kernels.layer_ops_for(x)
    if ops is None or x.dim() != 2:
        return None
    ctx = get_forward_context()
    meta = ctx.attn_metadata
    if not isinstance(meta, FewQueries) or x.shape[0] != ctx.num_tokens or positions.dtype != torch.int64:
        return None
    return ops, ctx, meta


def _build(ops: ModuleType, parts: DecoderParts, dtype: torch.dtype, few_rows: bool) -> object | None:
    """The extension's DecoderLayer, or None where a part has no fused form for activations of `dtype`."""
    linears = [m.cpu_op(dtype, few_rows) for m in (parts.qkv, parts.o, parts.gate_up, parts.down)]
    norms = (parts.input_norm, parts.post_norm)
    attn = parts.attn
    if (any(op is None for op in linears) or any(n.weight.dtype != dtype or n.eps != norms[0].eps for n in norms)
            or attn.head_dim % 8 or parts.rope.cos.device.type != "cpu"):
        return None
    return ops.DecoderLayer(*linears, norms[0].weight, norms[1].weight, norms[0].eps, parts.rope.cos, parts.rope.sin,
                            attn.num_heads, attn.num_kv_heads, attn.scale,
                            cpu_kernels.attention_path(dtype, attn.head_dim))
