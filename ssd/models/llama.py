"""Llama 3 family (and Llama-architecture models such as SmolLM2): the five classes.

Qwen3 (ssd/models/qwen3.py) reuses these and overrides only the attention's per-head norms.
"""

import torch
from torch import nn

from ssd.layers.activation import SiluAndMul
from ssd.layers.attention import Attention
from ssd.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from ssd.layers.fused_layer import DecoderParts, FusedDecoderLayer
from ssd.layers.fused_stack import FusedDecoderStack
from ssd.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from ssd.layers.norm import RMSNorm
from ssd.layers.rotary import get_rope
from ssd.model_config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, d, config.num_attention_heads, config.num_key_value_heads, config.attention_bias
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = d
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, config.attention_bias)
        self.rotary_emb = get_rope(d, config.max_position_embeddings, config.rope)
        self.attn = Attention(self.num_heads, self.num_kv_heads, d, d**-0.5)
        # Without per-head q/k norms, RoPE, the K/V store and attention may run as one call (Attention.rope_attend).
        self.fuses_rope = type(self).normalize_qk is LlamaAttention.normalize_qk

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """Hook for per-head q/k norms (Qwen3) over qk [T, H+KVH, D]; Llama has none."""
        return qk

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # [T], [T, d] -> [T, d]
        num_tokens = x.shape[0]
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x)  # [T, (H + 2*KVH) * D]
        fused = self.attn.rope_attend(positions, qkv, self.rotary_emb) if self.fuses_rope else None
        if fused is not None:
            return self.o_proj(fused)
        qk_size = (heads + kv_heads) * self.head_dim
        qk = qkv[:, :qk_size].reshape(num_tokens, heads + kv_heads, self.head_dim)  # q and k are adjacent
        qk = self.rotary_emb(positions, self.normalize_qk(qk))  # one RoPE call for both
        q, k = qk.split([heads, kv_heads], dim=1)
        out = self.attn(q.reshape(num_tokens, -1), k.reshape(num_tokens, -1), qkv[:, qk_size:])
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size, size])
        self.down_proj = RowParallelLinear(size, config.hidden_size)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    attention_cls: type[LlamaAttention] = LlamaAttention

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # On CPU, decode and verify forwards run the whole layer as one call (ssd/layers/fused_layer.py)
        self.fused = FusedDecoderLayer() if self.self_attn.fuses_rope else None
        self._parts: DecoderParts | None = None

    def parts(self) -> DecoderParts:
        """The modules the fused call reads (made once: a layer never swaps its submodules)."""
        if self._parts is None:
            attn = self.self_attn
            self._parts = DecoderParts(self.input_layernorm, attn.qkv_proj, attn.attn, attn.rotary_emb, attn.o_proj,
                                       self.post_attention_layernorm, self.mlp.gate_up_proj, self.mlp.down_proj)
        return self._parts

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's output delta, residual stream before it); their sum is the stream after."""
        if self.fused is not None and (out := self.fused(self.parts(), positions, x, residual)) is not None:
            return out
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([self.layer_cls(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # On CPU, decode and verify forwards run all the layers as one call (ssd/layers/fused_stack.py)
        self.fused_stack: FusedDecoderStack | None = FusedDecoderStack()

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        aux_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final hidden states [T, d], plus the residual stream entering each layer in `aux_layers`."""
        x = self.embed_tokens(input_ids)
        stacked = None if self.fused_stack is None else self.fused_stack(self.layers, positions, x, aux_layers)
        if stacked is not None:
            x, residual, aux = stacked
        else:
            residual = None
            aux = []
            for i, layer in enumerate(self.layers):
                if i in aux_layers:
                    aux.append(x if residual is None else x + residual)
                x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x, aux


class LlamaForCausalLM(nn.Module):
    model_cls: type[LlamaModel] = LlamaModel
    # checkpoint name fragment -> (fused parameter name fragment, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = self.model_cls(config)
        self.lm_head = ParallelLMHead(config.num_output_tokens, config.hidden_size)
        if config.tie_word_embeddings and config.output_vocab_size is None:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, aux_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.model(input_ids, positions, aux_layers)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, V] float32
        return self.lm_head(hidden)
