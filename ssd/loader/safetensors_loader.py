"""Load HF safetensors checkpoints (single file or sharded with an index) into our modules.

Checkpoint names are mapped onto fused parameters through the model's `packed_modules_mapping`;
each parameter's own `weight_loader` keeps this rank's shard.
"""

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ssd.errors import CheckpointError


def checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors weights")
    return files


def iter_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def read_tensor(folder: Path, name: str) -> torch.Tensor:
    """One named tensor of the checkpoint, read alone."""
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                return f.get_tensor(name)
    raise CheckpointError(f"{folder} has no tensor {name!r}")


def _target(name: str, mapping: dict[str, tuple[str, str | int]]) -> tuple[str, str | int | None]:
    for src, (dst, shard) in mapping.items():
        if f".{src}." in name:
            return name.replace(f".{src}.", f".{dst}."), shard
    return name, None


# Tensors a checkpoint may hold that are no parameter: a draft model's output-vocabulary map
# (ssd/loader/draft_checkpoint.py reads it)
NON_PARAMETER_KEYS = frozenset({"d2t"})


def load_weights(model: nn.Module, folder: Path, provided: dict[str, torch.Tensor] | None = None) -> None:
    """Fill every parameter of `model` from the checkpoint, then from `provided` (tensors by checkpoint name that
    the folder borrows, e.g. a draft's shared input embedding); raise CheckpointError naming what is missing."""
    params = dict(model.named_parameters(remove_duplicate=False))
    mapping = getattr(model, "packed_modules_mapping", {})
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    loaded: set[str] = set()
    for name, tensor in itertools.chain(iter_tensors(folder), (provided or {}).items()):
        if "rotary_emb.inv_freq" in name or name in NON_PARAMETER_KEYS:
            continue
        if tied and name == "lm_head.weight":
            continue
        target, shard = _target(name, mapping)
        param = params.get(target)
        if param is None:
            raise CheckpointError(f"checkpoint tensor {name!r} has no matching parameter in {type(model).__name__}")
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            tensor = tensor.to(param.dtype)
            if loader is None:
                param.data.copy_(tensor)
            elif shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
        loaded.add(target)
    if tied:
        loaded.add("lm_head.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise CheckpointError(f"checkpoint {folder} lacks weights for: {', '.join(missing[:10])}")
