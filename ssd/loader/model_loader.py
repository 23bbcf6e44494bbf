"""Build a model for a checkpoint folder: read its config, pick the class, load the weights, quantize them."""

from pathlib import Path

import torch
from torch import nn

from ssd.loader.draft_checkpoint import shared_tensors
from ssd.loader.quantize import QuantizationScheme, quantize_model, resolve_quantization
from ssd.loader.safetensors_loader import load_weights
from ssd.model_config import ModelConfig, load_model_config
from ssd.models.registry import model_class


def load_model(folder: Path, dtype: torch.dtype, quantization: str = "none") -> tuple[nn.Module, ModelConfig]:
    """The model of `folder` in `dtype`, its linears on `quantization` (an EngineConfig.quantization value)."""
    model, config, _ = load_quantized_model(folder, dtype, quantization)
    return model, config


def load_quantized_model(folder: Path, dtype: torch.dtype,
                         quantization: str) -> tuple[nn.Module, ModelConfig, QuantizationScheme]:
    """`load_model`, also returning what `quantization` resolved to for this checkpoint."""
    scheme = resolve_quantization(quantization, folder)
    config = load_model_config(folder)
    cls = model_class(config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    load_weights(model, folder, shared_tensors(folder, config.raw))
    scheme = quantize_model(model, folder, scheme, dtype)  # as applied
    model.eval()
    return model, config, scheme
