"""Maps a checkpoint's HF `model_type` to the class that implements it."""

from torch import nn

from ssd.errors import UnsupportedModelError
from ssd.model_config import ModelConfig
from ssd.models.llama import LlamaForCausalLM
from ssd.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
}


def model_class(config: ModelConfig) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[config.model_type]
    except KeyError:
        supported = ", ".join(sorted(MODEL_REGISTRY))
        raise UnsupportedModelError(
            f"model_type {config.model_type!r} is not supported; supported types: {supported}"
        ) from None
