"""The attention backends and the one place that picks one (`select_attention_backend`).

torch: the plain-torch reference (ssd/layers/padded_attention.py: gather each sequence's keys, batched matmuls or
SDPA), on every device.
cpu: the project's C++ layer op wherever a sequence brings up to MAX_MATMUL_QUERIES queries (keys read in place
through their slots): decode and chain verify as they are, uneven batches and token trees with a key list per query
row (query_rows.py); torch for prefill.
triton: `ssd_kernels.paged_attention` (the project's Triton kernel; on CPU it runs under TRITON_INTERPRET=1, for
tests). flash-attn: flash_attn's varlen kernel over gathered keys (CUDA; token trees fall back to torch).
`auto` = flash-attn where installed on CUDA, else triton on CUDA where the kernels package exists, else cpu on a
CPU where the project's CPU kernels build, else torch.
Every backend reads the same `ForwardContext` fields; `prepare` derives its own metadata once per forward.
"""

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ssd.config import ATTENTION_BACKENDS
from ssd.context import ForwardContext
from ssd.errors import InvalidRequestError
from ssd.layers.padded_attention import (
    MAX_MATMUL_QUERIES,
    PaddedBatch,
    key_slots,
    padded_batch,
    paged_attention,
    ragged_index,
)
from ssd.layers.query_rows import query_rows


class AttentionBackend(Protocol):
    name: str

    def prepare(self, ctx: ForwardContext) -> Any:
        """Per-forward metadata derived from the context on the device (shared by every layer)."""

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardContext, scale: float) -> torch.Tensor:
        """q [T, H, D], kv_cache [2, KVH, num_slots, D] (new K/V already stored) -> [T, H, D]."""


class TorchBackend:
    name = "torch"

    def prepare(self, ctx: ForwardContext) -> PaddedBatch:
        return padded_batch(ctx)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardContext, scale: float) -> torch.Tensor:
        return paged_attention(q, kv_cache, ctx.attn_metadata, scale)


@dataclass(frozen=True)
class FewQueries:
    """The cpu backend's view of a forward of few queries per sequence: each sequence's key slots and length (for
    uneven batches and trees a "sequence" is one query row and the keys it may see)."""

    kv_slots: torch.Tensor  # [B, S] int64: KV slot of each key (S = the longest seq_len)
    seq_lens: torch.Tensor  # [B] int64
    num_queries: int  # Q: the last Q keys of each sequence are its queries


class CpuBackend:
    """The project's CPU attention op where a forward has few queries per sequence, else torch."""

    name = "cpu"

    def __init__(self) -> None:
        self.fallback = TorchBackend()

    def prepare(self, ctx: ForwardContext) -> FewQueries | PaddedBatch:
        from ssd.layers import cpu_kernels

        if ctx.max_query_len > MAX_MATMUL_QUERIES or not cpu_kernels.layer_ops_enabled():
            return self.fallback.prepare(ctx)
        kv_slots = key_slots(ctx, ctx.max_seq_len)  # [B, S]
        if ctx.is_uniform and ctx.tree_mask is None:
            return FewQueries(kv_slots, ctx.seq_lens.to(torch.int64).contiguous(), ctx.max_query_len)
        rows = query_rows(ctx, kv_slots)  # ragged lengths or a tree: every query row a sequence of its own
        return self.fallback.prepare(ctx) if rows is None else FewQueries(*rows, num_queries=1)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardContext, scale: float) -> torch.Tensor:
        from ssd.layers import cpu_kernels

        meta = ctx.attn_metadata
        ops = cpu_kernels.layer_ops_for(q)
        if not isinstance(meta, FewQueries) or ops is None or q.shape[-1] % 8:
            if isinstance(meta, FewQueries):  # a dtype or head size the op does not take: the torch path
                ctx = dataclasses.replace(ctx, attn_metadata=self.fallback.prepare(ctx))
            return self.fallback.attend(q, kv_cache, ctx, scale)
        return ops.paged_attention(q.contiguous(), kv_cache, meta.kv_slots, meta.seq_lens, meta.num_queries, scale,
                                   cpu_kernels.attention_path(q.dtype, q.shape[-1]))


class TritonBackend:
    """The kernels package's paged attention; it reads the context's fields as they are."""

    name = "triton"

    def __init__(self) -> None:
        from ssd_kernels.paged_attention import (
            paged_attention,  # the top-level ssd_kernels package (optional)
        )

        self.kernel = paged_attention

    def prepare(self, ctx: ForwardContext) -> None:
        return None

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardContext, scale: float) -> torch.Tensor:
        return self.kernel(q, kv_cache[0], kv_cache[1], ctx.block_tables, ctx.seq_lens, ctx.query_start_loc,
                           ctx.max_query_len, scale, block_size=ctx.block_size, mask_start=ctx.mask_start,
                           tree_mask=ctx.tree_mask)


class FlashAttnBackend:
    """flash_attn_varlen_func over each sequence's keys gathered contiguous (written for CUDA; never run here:
    no GPU in the session that wrote it). Token trees take the torch path (flash-attn has no arbitrary mask)."""

    name = "flash-attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self.kernel = flash_attn_varlen_func
        self.fallback = TorchBackend()

    def prepare(self, ctx: ForwardContext) -> Any:
        if ctx.tree_mask is not None:
            return self.fallback.prepare(ctx)
        seq_lens = ctx.seq_lens.to(torch.int64)
        cu_k = torch.zeros(seq_lens.numel() + 1, dtype=torch.int32, device=seq_lens.device)
        cu_k[1:] = torch.cumsum(seq_lens, 0)
        seq, col = ragged_index(seq_lens, int(seq_lens.sum()))  # [sum(seq_lens)] (a host sync on CUDA)
        slots = ctx.block_tables[seq, col // ctx.block_size].to(torch.int64) * ctx.block_size + col % ctx.block_size
        return cu_k, slots

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, ctx: ForwardContext, scale: float) -> torch.Tensor:
        if ctx.tree_mask is not None:
            return self.fallback.attend(q, kv_cache, ctx, scale)
        cu_k, slots = ctx.attn_metadata
        kv = kv_cache[:, :, slots].transpose(1, 2)  # [2, sum(seq_lens), KVH, D]
        return self.kernel(q, kv[0], kv[1], ctx.query_start_loc, cu_k, ctx.max_query_len, ctx.max_seq_len,
                           softmax_scale=scale, causal=True)  # causal aligns queries to the end of the keys


def select_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """The backend for `--attention-backend name` on this device (the one place the choice is made)."""
    if name not in ATTENTION_BACKENDS:
        raise InvalidRequestError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
            return FlashAttnBackend()
        if device.type == "cuda" and importlib.util.find_spec("ssd_kernels") is not None:
            return TritonBackend()
        return CpuBackend() if device.type == "cpu" and _cpu_kernels_build() else TorchBackend()
    if name == "torch":
        return TorchBackend()
    if name == "cpu":
        if device.type != "cpu" or not _cpu_kernels_build():
            raise InvalidRequestError("attention backend cpu needs a CPU device where the project's CPU kernels build")
        return CpuBackend()
    if name == "flash-attn":
        if device.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
            raise InvalidRequestError("attention backend flash-attn needs CUDA and the flash_attn package")
        return FlashAttnBackend()
    if importlib.util.find_spec("ssd_kernels") is None or importlib.util.find_spec("ssd_kernels.paged_attention") is None:
        raise InvalidRequestError("attention backend triton needs the kernels package (ssd_kernels.paged_attention)")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        if "triton" in sys.modules:  # triton reads the variable when first imported: too late to set it now
            raise InvalidRequestError("attention backend triton on CPU runs in Triton's interpreter: start the "
                                      "process with TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter runs the kernel on CPU tensors
    return TritonBackend()


def _cpu_kernels_build() -> bool:
    from ssd.layers import cpu_kernels

    return cpu_kernels.extension() is not None
