"""Read and write EAGLE-3 head folders (config.json + model.safetensors in the public EAGLE-3 key layout).

`embed_tokens.weight` is optional in the file: when absent the head uses the target's embedding (frozen),
which is how this project ships heads. Missing, unexpected or mis-shaped tensors raise CheckpointError naming them.
"""

import json
from pathlib import Path

import structlog
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ssd.errors import CheckpointError
from ssd.models.eagle3 import Eagle3Config, Eagle3Head

log = structlog.get_logger(__name__)

EMBED_KEY = "embed_tokens.weight"
_INTEGER_KEYS = ("d2t", "t2d")  # vocabulary maps keep their own dtypes


def load_eagle3_config(folder: Path, target_num_layers: int | None = None) -> Eagle3Config:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json; it is not an EAGLE-3 head folder")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    return Eagle3Config.from_dict(raw, target_num_layers)


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no model.safetensors")
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is not a mapping


def load_eagle3_head(folder: Path, target_embedding: torch.Tensor | None, dtype: torch.dtype,
                     target_num_layers: int | None = None, device: str | torch.device = "cpu") -> Eagle3Head:
    """Build the head of `folder` in `dtype` on `device`; `target_embedding` [vocab, d] (any device) is
    used when the file has none."""
    config = load_eagle3_config(folder, target_num_layers)
    tensors = _read_tensors(folder)
    embedding = tensors.pop(EMBED_KEY, None)
    if embedding is None:
        embedding = target_embedding
    if embedding is None:
        raise CheckpointError(f"{folder} has no {EMBED_KEY} and no target embedding was given")
    head = Eagle3Head(config, embedding.to(dtype))
    expected = {k: v for k, v in head.state_dict().items() if k != EMBED_KEY}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mis_shaped = [f"{k} {tuple(tensors[k].shape)} != {tuple(v.shape)}"
                  for k, v in expected.items() if k in tensors and tensors[k].shape != v.shape]
    if embedding.shape != (config.vocab_size, config.hidden_size):
        mis_shaped.append(f"{EMBED_KEY} {tuple(embedding.shape)} != {(config.vocab_size, config.hidden_size)}")
    if missing or unexpected or mis_shaped:
        parts = [f"missing: {', '.join(missing)}" if missing else "",
                 f"unexpected: {', '.join(unexpected)}" if unexpected else "",
                 f"mis-shaped: {'; '.join(mis_shaped)}" if mis_shaped else ""]
        raise CheckpointError(f"EAGLE-3 head {folder} does not match its config: {' | '.join(p for p in parts if p)}")
    head.load_state_dict({**tensors, EMBED_KEY: head.embed_tokens.weight}, strict=True)
    head.to(dtype)
    head.d2t.copy_(tensors["d2t"].long())  # .to(dtype) leaves integer / bool buffers alone; be explicit
    head.t2d.copy_(tensors["t2d"].bool())
    head.to(device)  # a no-op on CPU; the embedding is not copied when it already is there in `dtype`
    head.eval()
    log.debug("loaded EAGLE-3 head", folder=str(folder), draft_vocab=config.draft_vocab_size)
    return head


def save_eagle3_head(head: Eagle3Head, folder: Path, dtype: torch.dtype | None = None,
                     include_embedding: bool = False) -> None:
    """Write config.json + model.safetensors; weights in `dtype` (default: as they are), maps as int64 / bool."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in head.state_dict().items():
        if name == EMBED_KEY and not include_embedding:
            continue
        if name not in _INTEGER_KEYS and dtype is not None:
            t = t.to(dtype)
        tensors[name] = t.detach().contiguous().clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
