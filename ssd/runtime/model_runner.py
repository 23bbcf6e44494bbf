"""Runs one model forward over a batch of sequences against the paged KV cache.

Every forward, whatever its mode, is a list of `ForwardItem`s: some new tokens per sequence,
stored at the physical KV positions right after the `start_position` tokens already cached.
By default they attend causally and their RoPE positions equal their physical positions;
a token tree instead brings its own logical positions and its own attention mask.
Prefill, decode, multi-token verify and tree verify are the same code with different items.

Device boundary: items are plain CPU data; the runner builds the index tensors on CPU, moves them to the
model's device, and hands the logits back on CPU (sampling and verification run there), while the target
features (`aux_hidden`) stay on the device.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ssd.context import ForwardContext, ForwardMode, forward_context
from ssd.layers.attention import bucketed


@dataclass(frozen=True)
class ForwardItem:
    token_ids: list[int]  # the new tokens this sequence feeds
    start_position: int  # physical KV position of the first new token (= tokens already in KV)
    block_table: list[int]  # the sequence's KV blocks, covering start_position + len(token_ids)
    num_logits: int = 1  # logits wanted for the last `num_logits` new tokens (0: a prompt chunk only fills KV)
    positions: list[int] | None = None  # RoPE positions of the new tokens; None = physical positions
    attn_mask: torch.Tensor | None = None  # [n, start_position + n] bool, True = may attend; None = causal


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [sum(num_logits), V] float32 on CPU, items in order (moved off the device here)
    # [T, len(aux_layers) * d] on the model's device: residual streams entering the aux layers. Never moved:
    # a draft in another process reads them from the GPU by CUDA IPC.
    aux_hidden: torch.Tensor | None


class ModelRunner:
    def __init__(self, model: nn.Module, block_size: int, device: torch.device, kv_cache: torch.Tensor) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.kv_cache = kv_cache  # [L, 2, KVH, num_slots, D]

    def slots(self, block_table: list[int], positions: torch.Tensor) -> torch.Tensor:
        table = torch.tensor(block_table, dtype=torch.long)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def _item_mask(self, it: ForwardItem, total: int) -> torch.Tensor:  # [n, total] bool
        if it.attn_mask is not None:
            return it.attn_mask
        n = len(it.token_ids)
        return torch.arange(total)[None, :] <= (it.start_position + torch.arange(n))[:, None]

    def build_context(self, items: list[ForwardItem], mode: ForwardMode) -> tuple[ForwardContext, torch.Tensor, torch.Tensor]:
        """The forward context plus input ids [T] and positions [T]."""
        lengths = [len(it.token_ids) for it in items]
        totals = [it.start_position + n for it, n in zip(items, lengths, strict=True)]
        num_q, num_s = max(lengths), bucketed(max(totals))  # keys padded to a bucket (see KEY_BUCKET)
        uniform = len(set(lengths)) == 1  # tokens already form [B, Q]: no padding gather needed
        ids, positions, slot_mapping, token_batch, token_offset = [], [], [], [], []
        query_index = torch.zeros(len(items), num_q, dtype=torch.long)
        kv_slots = torch.zeros(len(items), num_s, dtype=torch.long)
        mask = torch.zeros(len(items), num_q, num_s, dtype=torch.bool)
        mask[:, :, 0] = True  # padding queries look at key 0 so softmax stays finite
        offset = 0
        for b, (it, n, total) in enumerate(zip(items, lengths, totals, strict=True)):
            slots = self.slots(it.block_table, torch.arange(total))  # [total]
            kv_slots[b, :total] = slots
            slot_mapping.append(slots[it.start_position :])
            pos = torch.tensor(it.positions) if it.positions is not None else torch.arange(it.start_position, total)
            positions.append(pos)
            ids.extend(it.token_ids)
            mask[b, :n, :total] = self._item_mask(it, total)  # keys past `total` are bucket padding
            query_index[b, :n] = torch.arange(offset, offset + n)
            token_batch.extend([b] * n)
            token_offset.extend(range(n))
            offset += n
        ctx = ForwardContext(
            mode=mode,
            slot_mapping=torch.cat(slot_mapping).to(self.device),
            kv_slots=kv_slots.to(self.device),
            attn_mask=mask.unsqueeze(1).to(self.device),  # [B, 1, Q, S]: always, the key bucket pads every row
            query_index=None if uniform else query_index.to(self.device),
            token_batch=None if uniform else torch.tensor(token_batch, device=self.device),
            token_offset=None if uniform else torch.tensor(token_offset, device=self.device),
        )
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        return ctx, input_ids, torch.cat(positions).to(self.device)

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], mode: ForwardMode, aux_layers: tuple[int, ...] = ()) -> ForwardOutput:
        ctx, input_ids, positions = self.build_context(items, mode)
        with forward_context(ctx):
            hidden, aux = self.model(input_ids, positions, aux_layers)  # [T, d]
        keep, offset = [], 0
        for it in items:
            n = len(it.token_ids)
            keep.extend(range(offset + n - it.num_logits, offset + n))
            offset += n
        logits = self.model.compute_logits(hidden[torch.tensor(keep, dtype=torch.long, device=self.device)])  # [N, V]
        return ForwardOutput(logits.cpu(), torch.cat(aux, dim=-1) if aux else None)  # .cpu(): no copy on CPU

    def move_kv(self, block_table: list[int], src: list[int], dst: list[int]) -> None:
        """Copy the KV at physical positions `src` to `dst` in every layer (keeps an accepted tree path)."""
        pairs = [(s, d) for s, d in zip(src, dst, strict=True) if s != d]
        if not pairs:
            return
        src_slots = self.slots(block_table, torch.tensor([s for s, _ in pairs])).to(self.device)
        dst_slots = self.slots(block_table, torch.tensor([d for _, d in pairs])).to(self.device)
        self.kv_cache[:, :, :, dst_slots] = self.kv_cache[:, :, :, src_slots]
