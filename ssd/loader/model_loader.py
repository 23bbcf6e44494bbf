"""Build a model for a checkpoint folder: read its config, pick the class, load the weights."""

from pathlib import Path

import torch
from torch import nn

from ssd.errors import InvalidRequestError
from ssd.loader.safetensors_loader import load_weights
from ssd.model_config import ModelConfig, load_model_config
from ssd.models.registry import model_class

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InvalidRequestError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


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
