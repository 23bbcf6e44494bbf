"""The architecture of a checkpoint, read once from its config.json into a frozen dataclass.

Accepts both the transformers 4 (`rope_theta` + `rope_scaling`) and 5 (`rope_parameters`) spellings.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ssd.errors import CheckpointError


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope: RopeConfig
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # Rows of the LM head when it covers a trimmed output vocabulary (a draft model's, mapped to input ids by
    # the folder's `d2t` tensor: ssd/loader/draft_checkpoint.py); None = vocab_size (the usual case)
    output_vocab_size: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_output_tokens(self) -> int:
        """Rows of the LM head: the logits' width."""
        return self.output_vocab_size or self.vocab_size


def _rope_from(raw: dict[str, Any]) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise CheckpointError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'llama3'")
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def load_model_config(folder: Path) -> ModelConfig:
    """Read `folder/config.json`; raise CheckpointError if the folder is not a checkpoint."""
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise CheckpointError(f"{folder} is not a folder; expected a checkpoint folder with config.json")
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json; it is not a model checkpoint")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if "model_type" not in raw:
        raise CheckpointError(f"{path} has no model_type")
    try:
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        return ModelConfig(
            model_type=raw["model_type"],
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            rope=_rope_from(raw),
            eos_token_ids=_as_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
            output_vocab_size=int(raw["output_vocab_size"]) if raw.get("output_vocab_size") else None,
            raw=raw,
        )
    except KeyError as e:
        raise CheckpointError(f"{path} lacks required field {e.args[0]!r}") from e
