"""Build a model for a checkpoint folder: read its config, pick the class, load the weights."""

from pathlib import Path

import torch
from torch import nn

from ssd.loader.safetensors_loader import load_weights
from ssd.model_config import ModelConfig, load_model_config
from ssd.models.registry import model_class


def load_model(folder: Path, dtype: torch.dtype) -> tuple[nn.Module, ModelConfig]:
    config = load_model_config(folder)
    cls = model_class(config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    load_weights(model, folder)
    model.eval()
    return model, config
