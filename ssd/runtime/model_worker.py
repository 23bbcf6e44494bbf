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

from ssd.context import ForwardMode
from ssd.device import resolve_device
from ssd.distributed import WHOLE, TensorParallel, tensor_parallel
from ssd.dtypes import parse_dtype
from ssd.kv.block_manager import BlockManager
from ssd.kv.kv_cache import KVCacheShape, allocate_kv_cache
from ssd.layers import cpu_kernels
from ssd.layers.attention_backend import select_attention_backend
from ssd.layers.linear import pack_linear_weights
from ssd.loader.model_loader import load_quantized_model
from ssd.loader.safetensors_loader import read_tensor
from ssd.runtime.compile import CompiledModel, resolve_compile, warm_up
from ssd.runtime.model_runner import ForwardItem, ModelRunner

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
        *,
        attention_backend: str = "auto",
        compile: str = "auto",
        enforce_eager: bool = False,
        max_num_seqs: int | None = None,
    ) -> None:
        started = time.perf_counter()
        self.path = path
        self.device = resolve_device(device)
        self.dtype = parse_dtype(dtype, self.device)  # "auto": bfloat16 where the device runs it natively
        self.tp = tp
        with tensor_parallel(tp), cpu_kernels.decode_batch(max_num_seqs):  # the quantized kernels' path: by it
            self.model, self.model_config, self.quantization = load_quantized_model(path, self.dtype, quantization)
        self.model.to(self.device)  # a no-op on CPU
        self.is_compiled = resolve_compile(compile, self.device, enforce_eager, tp.size)
        if linear_backend == "onednn" and self.device.type == "cpu":  # oneDNN packing is a CPU weight layout
            # Compiled, inductor packs the graph's linears itself (freezing); only the LM head runs eager.
            if self.is_compiled:
                self.model.lm_head.pack()
            else:
                pack_linear_weights(self.model)
        mc = self.model_config
        kv_heads = mc.num_key_value_heads // tp.size  # this rank's
        shape = KVCacheShape(mc.num_hidden_layers, kv_heads, mc.head_dim, block_size, self.dtype)
        self.num_blocks = shape.num_blocks_for(kv_cache_memory_mb * 2**20)
        self.kv_cache = allocate_kv_cache(self.model, shape, self.num_blocks, self.device)  # [L, 2, KVH, slots, D]
        self.block_manager = BlockManager(self.num_blocks, block_size, enable_prefix_caching)
        backend = select_attention_backend(attention_backend, self.device)
        compiled = CompiledModel(self.model, self.device) if self.is_compiled else None
        self.runner = ModelRunner(self.model, block_size, self.device, self.kv_cache, backend, compiled)
        self.compile_s = warm_up(self._warm_up_forward) if compiled is not None else 0.0
        self.load_s = time.perf_counter() - started
        log.info("model worker ready", attention_backend=backend.name, compiled=self.is_compiled,
                 compile_s=round(self.compile_s, 1))

    def _warm_up_forward(self, num_tokens: int) -> None:
        """One throwaway forward of `num_tokens` tokens into block 0 (no sequence holds a block yet)."""
        blocks = list(range(-(-num_tokens // self.block_manager.block_size)))
        self.runner.forward([ForwardItem([0] * num_tokens, 0, blocks)], ForwardMode.PREFILL)

    @classmethod
    def for_engine(cls, path: Path, config: "EngineConfig", device: str | torch.device,
                   tp: TensorParallel = WHOLE) -> "ModelWorker":
        """The target's worker (or one rank's shard of it) as an engine config describes it."""
        return cls(path, config.dtype, config.block_size, config.kv_cache_memory_mb, config.linear_backend,
                   config.enable_prefix_caching, device, tp=tp, quantization=config.quantization,
                   attention_backend=config.attention_backend, compile=config.compile,
                   enforce_eager=config.enforce_eager, max_num_seqs=config.max_num_seqs)

    def input_embedding(self) -> torch.Tensor:
        """The whole input embedding [V, d] (an EAGLE-3 head reads it); a sharded worker reads it from disk."""
        weight = self.model.model.embed_tokens.weight
        if self.tp.size == 1:
            return weight
        return read_tensor(self.path, "model.embed_tokens.weight").to(weight.dtype).to(self.device)
