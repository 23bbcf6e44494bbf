"""Qwen3: Llama layers plus per-head RMSNorm on queries and keys (and optional qkv bias)."""

import torch

from ssd.layers.norm import RMSNorm
from ssd.model_config import ModelConfig
from ssd.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:  # [T, H+KVH, D]
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model
