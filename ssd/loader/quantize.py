"""Put a loaded model's linear layers on quantized weights: the checkpoint's own int4 cache, or int8 / int4
computed from its float weights at load.

`quantization` (EngineConfig): "none"; "auto" = the checkpoint's own quantization if it has one (a GGUF
import's int4 cache, ssd/quantized_weights.py), else none; "int8" (per output channel); "int4" or "int4:G"
(groups of G input features; plain int4 uses the checkpoint's own int4 weights where it has them, else
groups of 32). Embeddings stay float (a lookup reads one row). The LM head stays float too, except where the
checkpoint's own int4 form comes with its own Q8_0 head (the default model's GGUF ties it to the embedding):
then the head also reads those 8-bit blocks on CPU (ParallelLMHead.use_q8).
A tensor-parallel rank quantizes (or loads) only its shard; int4 groups never cross a shard boundary.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from torch import nn

from ssd.errors import CheckpointError, InvalidRequestError
from ssd.layers.embedding import ParallelLMHead
from ssd.layers.linear import quantizable_linears
from ssd.layers.quantized_linear import Int4Matmul, Int8Matmul
from ssd.quantized_weights import (
    GGUF_BLOCK,
    INT4_GROUP_SIZES,
    Int4Weight,
    has_int4_cache,
    has_q8_head,
    load_int4_cache,
    load_q8_head,
    quantize_int4,
    quantize_int8,
)

log = structlog.get_logger(__name__)

DEFAULT_GROUP_SIZE = 32


@dataclass(frozen=True)
class QuantizationScheme:
    method: str  # "none" | "int8" | "int4"
    group_size: int | None = None  # int4 only; None = the checkpoint's own (or DEFAULT_GROUP_SIZE)
    is_own: bool = False  # the checkpoint's own quantized weights, not computed at load
    has_q8_head: bool = False  # the checkpoint's own Q8_0 LM head comes with them

    def describe(self) -> str:
        if self.method != "int4":
            return self.method
        head = "; LM head q8_0" if self.has_q8_head else ""
        return f"int4 (group {self.group_size}, {'checkpoint' if self.is_own else 'quantized at load'}{head})"


def resolve_quantization(requested: str, folder: Path) -> QuantizationScheme:
    """What `requested` (an EngineConfig.quantization value) means for the checkpoint `folder`."""
    method, _, group = requested.partition(":")
    own = has_int4_cache(folder)
    own_scheme = QuantizationScheme("int4", GGUF_BLOCK, is_own=True, has_q8_head=has_q8_head(folder))
    if method == "auto":
        return own_scheme if own else QuantizationScheme("none")
    if method in ("none", "int8"):
        return QuantizationScheme(method)
    if method != "int4":
        raise InvalidRequestError(f"quantization must be none, auto, int8, int4 or int4:G, got {requested!r}")
    size = int(group) if group else None
    if size is not None and size not in INT4_GROUP_SIZES:
        raise InvalidRequestError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {size}")
    if own and size in (None, GGUF_BLOCK):
        return own_scheme
    return QuantizationScheme("int4", size or DEFAULT_GROUP_SIZE)


def quantize_model(model: nn.Module, folder: Path, scheme: QuantizationScheme,
                   dtype: torch.dtype) -> QuantizationScheme:
    """Swap every decoder linear of `model` (loaded, on CPU) to `scheme`'s weights; returns the scheme as applied
    (without its Q8_0 head where the head could not use it)."""
    if scheme.method == "none":
        return scheme
    own = load_int4_cache(folder) if scheme.is_own else {}
    count = 0
    for name, module in quantizable_linears(model):
        device = module.weight.device
        if scheme.is_own:
            weight: Int4Weight = _own_shard(model, module, name, own)
            matmul: Int4Matmul | Int8Matmul = Int4Matmul(weight, dtype, device)
        elif scheme.method == "int4":
            matmul = Int4Matmul(quantize_int4(module.weight, _group_for(module, name, scheme)), dtype, device)
        else:
            matmul = Int8Matmul(quantize_int8(module.weight), dtype, device)
        module.use_quantized(matmul)
        count += 1
    if scheme.has_q8_head and not _use_q8_head(model, folder):
        scheme = dataclasses.replace(scheme, has_q8_head=False)
    log.info("quantized linear layers", quantization=scheme.describe(), num_linears=count)
    return scheme


def _use_q8_head(model: nn.Module, folder: Path) -> bool:
    head = load_q8_head(folder)
    lm_head = getattr(model, "lm_head", None)
    used = head is not None and isinstance(lm_head, ParallelLMHead) and lm_head.use_q8(head)
    if used:
        log.info("LM head reads the checkpoint's q8_0 blocks for few-row forwards", shape=list(head.codes.shape))
    return used


def _group_for(module: nn.Module, name: str, scheme: QuantizationScheme) -> int:
    size = scheme.group_size or DEFAULT_GROUP_SIZE
    if module.weight.shape[1] % size:
        raise InvalidRequestError(f"{name}: {module.weight.shape[1]} input features (this rank's) are not a "
                                  f"multiple of the int4 group size {size}")
    return size


def _own_shard(model: nn.Module, module: nn.Module, name: str, own: dict[str, Int4Weight]) -> Int4Weight:
    """This rank's shard of the cached int4 weight(s) that feed `module`, through its own weight loader."""
    n, k = module.weight.shape  # this rank's shard
    group = GGUF_BLOCK
    if k % group:
        raise InvalidRequestError(f"{name}: {k} input features (this rank's) split the GGUF's blocks of {group}")
    parts = {"codes": torch.empty(n, k // 2, dtype=torch.uint8), "scales": torch.empty(n, k // group),
             "zeros": torch.empty(n, k // group)}
    sources = _checkpoint_sources(model, name)
    for source, shard_id in sources:
        if source not in own:
            raise CheckpointError(f"the int4 cache has no {source}; re-pull the model (`ssd models pull --force`)")
        for part, buffer in parts.items():
            full = getattr(own[source], part)
            if shard_id is None:
                module.weight_loader(buffer, full)  # type: ignore[arg-type]
            else:
                module.weight_loader(buffer, full, shard_id)  # type: ignore[arg-type, call-arg]
    return Int4Weight(parts["codes"], parts["scales"], parts["zeros"])


def _checkpoint_sources(model: nn.Module, name: str) -> list[tuple[str, str | int | None]]:
    """The checkpoint tensors (without `.weight`) that load into module `name`, with their shard ids."""
    mapping: dict[str, tuple[str, str | int]] = getattr(model, "packed_modules_mapping", {})
    prefix, _, leaf = name.rpartition(".")
    sources = [(f"{prefix}.{src}", shard) for src, (dst, shard) in mapping.items() if dst == leaf]
    return sources or [(name, None)]
