"""A loaded model with its own paged KV cache, block manager and runner, on one device.

The target engine and a draft-model proposer each own one; nothing is shared between them. The model is
built and loaded on CPU, then moved to the device; the KV cache is allocated there. Built for a
`TensorParallel` of size N, the worker holds one rank's shard: 1/N of the heads (and of their KV cache), of
the MLP width and of the vocabulary.
"""

import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import torch

from ssd.device import resolve_device
from ssd.distributed import WHOLE, TensorParallel, tensor_parallel
from ssd.dtypes import parse_dtype
from ssd.kv.block_manager import BlockManager
from ssd.kv.kv_cache import KVCacheShape, allocate_kv_cache
from ssd.layers.linear import pack_linear_weights
from ssd.loader.model_loader import load_quantized_model
from ssd.loader.safetensors_loader import read_tensor
from ssd.runtime.model_runner import ModelRunner

if TYPE_CHECKING:
    from ssd.config import EngineConfig

log = structlog.get_logger(__name__)


class ModelWorker:
    def __init__(
        self,
        path: Path,
        dtype: str,
        block_size: int,
        kv_cache_memory_mb: int,
        linear_backend: str = "onednn",
        enable_prefix_caching: bool = True,
        device: str | torch.device = "cpu",
        tp: TensorParallel = WHOLE,
        quantization: str = "none",
    ) -> None:
        started = time.perf_counter()
        self.path = path
        self.device = resolve_device(device)
        self.dtype = parse_dtype(dtype, self.device)  # "auto": bfloat16 where the device runs it natively
        self.tp = tp
        with tensor_parallel(tp):
            self.model, self.model_config, self.quantization = load_quantized_model(path, self.dtype, quantization)
        self.model.to(self.device)  # a no-op on CPU
        if linear_backend == "onednn" and self.device.type == "cpu":  # oneDNN packing is a CPU weight layout
            pack_linear_weights(self.model)
        mc = self.model_config
        kv_heads = mc.num_key_value_heads // tp.size  # this rank's
        shape = KVCacheShape(mc.num_hidden_layers, kv_heads, mc.head_dim, block_size, self.dtype)
        self.num_blocks = shape.num_blocks_for(kv_cache_memory_mb * 2**20)
        self.kv_cache = allocate_kv_cache(self.model, shape, self.num_blocks, self.device)  # [L, 2, KVH, slots, D]
        self.block_manager = BlockManager(self.num_blocks, block_size, enable_prefix_caching)
        self.runner = ModelRunner(self.model, block_size, self.device, self.kv_cache)
        self.load_s = time.perf_counter() - started

    @classmethod
    def for_engine(cls, path: Path, config: "EngineConfig", device: str | torch.device,
                   tp: TensorParallel = WHOLE) -> "ModelWorker":
        """The target's worker (or one rank's shard of it) as an engine config describes it."""
        return cls(path, config.dtype, config.block_size, config.kv_cache_memory_mb, config.linear_backend,
                   config.enable_prefix_caching, device, tp=tp, quantization=config.quantization)

    def input_embedding(self) -> torch.Tensor:
        """The whole input embedding [V, d] (an EAGLE-3 head reads it); a sharded worker reads it from disk."""
        weight = self.model.model.embed_tokens.weight
        if self.tp.size == 1:
            return weight
        return read_tensor(self.path, "model.embed_tokens.weight").to(weight.dtype).to(self.device)
