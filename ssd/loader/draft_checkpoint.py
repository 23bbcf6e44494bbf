"""A draft model folder: an HF Llama checkpoint whose LM head covers a trimmed output vocabulary and whose input
embedding may be borrowed from its target.

Beyond the HF layout: config.json says `output_vocab_size` (the LM head's rows, Vd) and the safetensors hold
`d2t` [Vd] int64 (the EAGLE-3 convention: target id = draft id + d2t[draft id]). The input embedding covers
the whole target vocabulary (input ids are target ids); when `model.embed_tokens.weight` is not in the file,
config.json's `ssd_shared_embedding` names the target checkpoint it is read from and the sha256 of its bytes,
so a folder never loads against another target's embedding. HF transformers cannot load such a folder as it
is (its LlamaForCausalLM has one vocabulary); the engine's loader (model_loader.py) does.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ssd.errors import CheckpointError, ModelNotFoundError
from ssd.loader.safetensors_loader import checkpoint_files, read_tensor
from ssd.model_store import resolve_model

D2T_KEY = "d2t"  # [Vd] int64: target id - draft id of each output row
EMBED_KEY = "model.embed_tokens.weight"
SHARED_EMBEDDING = "ssd_shared_embedding"  # config.json key: {"model": name or path, "sha256": hex digest}


def tensor_sha256(t: torch.Tensor) -> str:
    """The digest of a tensor's bytes (its dtype's, as stored)."""
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _has_tensor(folder: Path, name: str) -> bool:
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                return True
    return False


def output_token_ids(folder: Path) -> torch.Tensor | None:
    """[Vd] int64 target id of each LM-head row (increasing), or None when the head covers the whole vocabulary."""
    if not _has_tensor(folder, D2T_KEY):
        return None
    d2t = read_tensor(folder, D2T_KEY).long()  # [Vd]
    return torch.arange(d2t.numel()) + d2t


def shared_tensors(folder: Path, raw_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a folder borrows from elsewhere ({EMBED_KEY: [V, d]} from its target), checked; {} for none."""
    source = raw_config.get(SHARED_EMBEDDING)
    if not source or _has_tensor(folder, EMBED_KEY):
        return {}
    target = resolve_model(str(source["model"]))
    embedding = read_tensor(target, EMBED_KEY)  # [V, d]
    if source.get("sha256") and tensor_sha256(embedding) != source["sha256"]:
        raise CheckpointError(f"{folder} shares the input embedding of {source['model']!r}, but {target} holds "
                              "another one (sha256 differs): it was trained for another target")
    return {EMBED_KEY: embedding}


def embedding_source(target: Path) -> str:
    """How a folder names `target`: its model name when that resolves back to it, else its absolute path."""
    try:
        if resolve_model(target.name) == target.resolve():
            return target.name
    except ModelNotFoundError:
        pass
    return str(target.resolve())


def save_draft_model(folder: Path, config: dict[str, Any], weights: dict[str, torch.Tensor],
                     target_ids: torch.Tensor, target: Path | None) -> None:
    """Write config.json + model.safetensors. `weights` in the HF layout (no embedding when `target` is given:
    it is shared from there); `target_ids` [Vd] the target id of each LM-head row."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in weights.items()}
    tensors[D2T_KEY] = (target_ids.long() - torch.arange(target_ids.numel())).contiguous()
    config = {**config, "output_vocab_size": int(target_ids.numel()), "tie_word_embeddings": False}
    if target is not None:
        embedding = read_tensor(target, EMBED_KEY)
        config[SHARED_EMBEDDING] = {"model": embedding_source(target), "sha256": tensor_sha256(embedding)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
