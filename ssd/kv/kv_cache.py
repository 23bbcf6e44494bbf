"""The KV cache tensors, sized from a memory budget, and their binding to attention layers."""

from dataclasses import dataclass

import torch
from torch import nn

from ssd.errors import ResourceExhaustedError
from ssd.layers.attention import Attention


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def num_blocks_for(self, memory_bytes: int) -> int:
        num = memory_bytes // self.bytes_per_block
        if num < 1:
            raise ResourceExhaustedError(
                f"KV cache budget of {memory_bytes} bytes holds no block ({self.bytes_per_block} bytes each)"
            )
        return int(num)


def allocate_kv_cache(model: nn.Module, shape: KVCacheShape, num_blocks: int, device: torch.device) -> torch.Tensor:
    """One head-major tensor [L, 2, KVH, num_blocks*block_size, D]; each Attention layer gets its contiguous slice."""
    num_slots = num_blocks * shape.block_size
    cache = torch.zeros(shape.num_layers, 2, shape.num_kv_heads, num_slots, shape.head_dim, dtype=shape.dtype,
                        device=device)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if len(layers) != shape.num_layers:
        raise RuntimeError(f"model has {len(layers)} attention layers, cache was shaped for {shape.num_layers}")
    for i, layer in enumerate(layers):
        layer.kv_cache = cache[i]
    return cache
