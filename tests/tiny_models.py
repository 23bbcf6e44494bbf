"""Tiny random-weight HF checkpoints written to a temp folder (no downloads, seconds to build)."""

import json
import shutil
from pathlib import Path
from typing import Any

import torch

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def tiny_config(kind: str = "llama", **overrides: Any):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=1,
        bos_token_id=0,
        initializer_range=0.2,  # peaked distributions: greedy tests avoid near-ties
    )
    common.update(overrides)
    if kind == "llama":
        return LlamaConfig(**common)
    if kind == "qwen3":
        common.setdefault("head_dim", 24)
        common.setdefault("attention_bias", True)
        return Qwen3Config(**common)
    raise ValueError(kind)


def write_tiny_checkpoint(folder: Path, kind: str = "llama", seed: int = 0, dtype=torch.float32, **overrides: Any):  # type: ignore[no-untyped-def]
    """Write config.json + model.safetensors of a random model; return the HF model too."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(kind, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # HF init leaves norms at 1; randomize so norm weights are exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1:
                p.normal_(0, 0.1)
    model.eval()
    model.save_pretrained(folder)
    return model


def write_tiny_target_and_draft(tmp_path_factory, prefix: str) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """A tiny Llama target (seed 0) and a one-layer draft over its vocabulary (seed 1), each in its own temp folder."""
    target, draft = tmp_path_factory.mktemp(f"{prefix}-target"), tmp_path_factory.mktemp(f"{prefix}-draft")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_checkpoint(draft, "llama", seed=1, num_hidden_layers=1)
    return target, draft


def write_trimmed_draft(folder: Path, target: Path, target_ids: list[int], seed: int = 1, **overrides: Any):  # type: ignore[no-untyped-def]
    """A random draft model over `target`'s vocabulary with its LM head trimmed to `target_ids` and the input
    embedding shared from `target` (ssd/loader/draft_checkpoint.py); returns the HF model it was cut from."""
    from ssd.loader.draft_checkpoint import EMBED_KEY, save_draft_model

    scratch = folder / "full"
    model = write_tiny_checkpoint(scratch, "llama", seed=seed, **overrides)
    ids = torch.tensor(target_ids)
    weights = {k: v for k, v in model.state_dict().items() if k != EMBED_KEY}
    weights["lm_head.weight"] = weights["lm_head.weight"][ids]
    config = json.loads((scratch / "config.json").read_text())
    save_draft_model(folder, config, weights, ids, target)
    shutil.rmtree(scratch)
    return model
