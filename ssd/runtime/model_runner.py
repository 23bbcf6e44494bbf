"""Runs one model forward over a batch of sequences against the paged KV cache.

Every forward, whatever its mode, is a list of `ForwardItem`s: some new tokens per sequence,
stored at the physical KV positions right after the `start_position` tokens already cached.
By default they attend causally and their RoPE positions equal their physical positions;
a token tree instead brings its own logical positions and its own attention mask.
Prefill, decode, multi-token verify and tree verify are the same code with different items.

Device boundary: items are plain CPU data; `StepInputs` builds the kernel-style context on the model's
device (ssd/runtime/step_inputs.py), the attention backend derives its metadata once, the model runs compiled
or eager (ssd/runtime/compile.py), and the logits come back on CPU (sampling and verification run there),
while the target features (`aux_hidden`) stay on the device.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ssd.context import ForwardContext, ForwardMode, forward_context
from ssd.layers.attention_backend import AttentionBackend, TorchBackend
from ssd.runtime.compile import CompiledModel
from ssd.runtime.step_inputs import ForwardItem, StepInputs

__all__ = ["ForwardItem", "ForwardOutput", "ModelRunner"]


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [sum(num_logits), V] float32 on CPU, items in order (moved off the device here)
    # [T, len(aux_layers) * d] on the model's device: residual streams entering the aux layers. Never moved:
    # a draft in another process reads them from the GPU by CUDA IPC.
    aux_hidden: torch.Tensor | None


def logit_rows(lengths: list[int], num_logits: list[int]) -> torch.Tensor:
    """[sum(num_logits)] int64: the flat rows of each item's last num_logits tokens, items in order."""
    ends = np.cumsum(lengths)  # [B]
    wanted = np.array(num_logits, dtype=np.int64)  # [B]
    item = np.repeat(np.arange(len(lengths)), wanted)  # [N]
    within = np.arange(len(item)) - (np.cumsum(wanted) - wanted)[item]  # [N]
    return torch.from_numpy((ends - wanted)[item] + within)


class ModelRunner:
    def __init__(self, model: nn.Module, block_size: int, device: torch.device, kv_cache: torch.Tensor,
                 backend: AttentionBackend | None = None, compiled: CompiledModel | None = None) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.kv_cache = kv_cache  # [L, 2, KVH, num_slots, D]
        self.backend = backend or TorchBackend()
        self.compiled = compiled  # None: every forward eager
        self.step_inputs = StepInputs(block_size, device)

    def slots(self, block_table: list[int], positions: torch.Tensor) -> torch.Tensor:
        table = torch.tensor(block_table, dtype=torch.long)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def build_context(self, items: list[ForwardItem], mode: ForwardMode,
                      padded_tokens: int | None = None) -> tuple[ForwardContext, torch.Tensor, torch.Tensor]:
        """The forward context (with the backend's metadata) plus input ids and positions [padded_tokens or T]."""
        ctx, input_ids, positions = self.step_inputs.build(items, mode, padded_tokens)
        meta = self.backend.prepare(ctx)  # no backend reads ctx.backend
        return dataclasses.replace(ctx, backend=self.backend, attn_metadata=meta), input_ids, positions

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], mode: ForwardMode, aux_layers: tuple[int, ...] = ()) -> ForwardOutput:
        lengths = [len(it.token_ids) for it in items]
        num_tokens = sum(lengths)
        compiled = self.compiled
        rows = compiled.rows_for(num_tokens) if compiled is not None else None
        ctx, input_ids, positions = self.build_context(items, mode, rows)
        with forward_context(ctx):
            model = compiled if compiled is not None else self.model
            hidden, aux = model(input_ids, positions, aux_layers)  # [rows, d] (rows >= T: padding of a graph)
        keep = logit_rows(lengths, [it.num_logits for it in items]).to(self.device)
        logits = self.model.compute_logits(hidden[keep])  # [N, V]
        aux = [a[:num_tokens] for a in aux]
        return ForwardOutput(logits.cpu(), torch.cat(aux, dim=-1) if aux else None)  # .cpu(): no copy on CPU

    def move_kv(self, block_table: list[int], src: list[int], dst: list[int]) -> None:
        """Copy the KV at physical positions `src` to `dst` in every layer (keeps an accepted tree path)."""
        pairs = [(s, d) for s, d in zip(src, dst, strict=True) if s != d]
        if not pairs:
            return
        src_slots = self.slots(block_table, torch.tensor([s for s, _ in pairs])).to(self.device)
        dst_slots = self.slots(block_table, torch.tensor([d for _, d in pairs])).to(self.device)
        self.kv_cache[:, :, :, dst_slots] = self.kv_cache[:, :, :, src_slots]
