"""Tiny random-weight HF checkpoints written to a temp folder (no downloads, seconds to build)."""

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
