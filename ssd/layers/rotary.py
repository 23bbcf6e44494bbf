"""Rotary position embedding (rotate-half convention), including Llama-3 frequency scaling.

On CPU it is one call of the project's layer op (ssd/layers/cpu_kernels.py), reading the same float32 tables.
"""

import math

import torch
from torch import nn

from ssd.layers import cpu_kernels
from ssd.model_config import RopeConfig


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:  # [head_dim // 2]
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputes cos/sin for every position up to `max_positions`; applies them to q and k.

    One instance is shared by all layers (`get_rope`), and the cos/sin rows for a forward's
    positions are looked up once and reused by every layer.
    """

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, rope)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [P, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, D]
        # Plain float32 attributes, not buffers: this instance is shared by every model with these settings
        # (`get_rope`), so `model.to(bfloat16)` on one model must not round the tables of all the others.
        self.cos = emb.cos()  # [P, D] on CPU
        self.sin = emb.sin()  # [P, D] on CPU
        # Copies on other devices (not moved by .to(): models on several devices may share this instance).
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.head_dim = head_dim
        self._memo: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # cos, sin [P, D]
        if device == self.cos.device:
            return self.cos, self.sin
        if device not in self._on_device:
            self._on_device[device] = (self.cos.to(device), self.sin.to(device))
        return self._on_device[device]

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():  # a graph: the lookups are plain ops, no memo (it is host state)
            cos_table, sin_table = self._tables(positions.device)
            return cos_table[positions].unsqueeze(1).to(dtype), sin_table[positions].unsqueeze(1).to(dtype)
        memo = self._memo
        if memo is not None and memo[0] is positions and memo[1] == dtype:
            return memo[2], memo[3]
        cos_table, sin_table = self._tables(positions.device)  # the tables follow the forward's device
        cos = cos_table[positions].unsqueeze(1).to(dtype)  # [T, 1, D]
        sin = sin_table[positions].unsqueeze(1).to(dtype)
        self._memo = (positions, dtype, cos, sin)
        return cos, sin

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        x: torch.Tensor,  # [T, heads, D]: queries and/or keys
    ) -> torch.Tensor:  # [T, heads, D]
        ops = cpu_kernels.layer_ops_for(x)
        if (ops is not None and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == self.head_dim
                and positions.dtype == torch.int64 and positions.shape == x.shape[:1]):
            return ops.rope(x, positions, self.cos, self.sin)  # the CPU tables are float32, as the torch path's
        cos, sin = self._cos_sin(positions, x.dtype)
        return x * cos + self._rotate_half(x) * sin


_shared: dict[tuple[int, int, RopeConfig], RotaryEmbedding] = {}


def get_rope(head_dim: int, max_positions: int, rope: RopeConfig) -> RotaryEmbedding:
    """The one RotaryEmbedding for these settings (its tables are shared by every layer)."""
    key = (head_dim, max_positions, rope)
    if key not in _shared:
        _shared[key] = RotaryEmbedding(head_dim, max_positions, rope)
    return _shared[key]
