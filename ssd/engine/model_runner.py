"""Runs one model forward over a batch of sequences against the paged KV cache.

Every forward, whatever its mode, is a list of `ForwardItem`s: some new tokens per sequence
starting at a position, attending causally to everything before them in that sequence. Prefill,
decode and multi-token verify are the same code with different token counts.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ssd.context import ForwardContext, ForwardMode, forward_context


@dataclass(frozen=True)
class ForwardItem:
    token_ids: list[int]  # the new tokens this sequence feeds
    start_position: int  # logical position of the first new token (= tokens already in KV)
    block_table: list[int]  # the sequence's KV blocks, covering start_position + len(token_ids)
    num_logits: int = 1  # logits wanted for the last `num_logits` new tokens


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [sum(num_logits), V] float32, items in order
    aux_hidden: list[torch.Tensor]  # per requested aux layer: [sum(num_logits), d]


class ModelRunner:
    def __init__(self, model: nn.Module, block_size: int, device: torch.device) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device

    def build_context(self, items: list[ForwardItem], mode: ForwardMode) -> tuple[ForwardContext, torch.Tensor, torch.Tensor]:
        """The forward context plus input ids [T] and positions [T]."""
        bs = self.block_size
        lengths = [len(it.token_ids) for it in items]
        totals = [it.start_position + n for it, n in zip(items, lengths, strict=True)]
        num_q, num_s = max(lengths), max(totals)
        ids, positions, slot_mapping, token_batch, token_offset = [], [], [], [], []
        query_index = torch.zeros(len(items), num_q, dtype=torch.long)
        kv_slots = torch.zeros(len(items), num_s, dtype=torch.long)
        offset = 0
        for b, (it, n, total) in enumerate(zip(items, lengths, totals, strict=True)):
            table = torch.tensor(it.block_table, dtype=torch.long)
            pos = torch.arange(total)
            slots = table[pos // bs] * bs + pos % bs  # [total]
            kv_slots[b, :total] = slots
            slot_mapping.append(slots[it.start_position :])
            positions.append(pos[it.start_position :])
            ids.extend(it.token_ids)
            query_index[b, :n] = torch.arange(offset, offset + n)
            token_batch.extend([b] * n)
            token_offset.extend(range(n))
            offset += n
        mask = None
        if len(items) > 1 or num_q > 1:
            starts = torch.tensor([it.start_position for it in items])
            qpos = starts[:, None] + torch.arange(num_q)[None, :]  # [B, Q]
            key = torch.arange(num_s)
            valid_q = (torch.arange(num_q)[None, :] < torch.tensor(lengths)[:, None])[:, :, None]  # [B, Q, 1]
            mask = (key[None, None, :] <= qpos[:, :, None]) & valid_q  # [B, Q, S]
            mask |= ~valid_q & (key == 0)  # padding queries look at key 0 so softmax stays finite
            mask = mask.unsqueeze(1).to(self.device)  # [B, 1, Q, S]
        single = len(items) == 1
        ctx = ForwardContext(
            mode=mode,
            slot_mapping=torch.cat(slot_mapping).to(self.device),
            kv_slots=kv_slots.to(self.device),
            attn_mask=mask,
            query_index=None if single else query_index.to(self.device),
            token_batch=None if single else torch.tensor(token_batch, device=self.device),
            token_offset=None if single else torch.tensor(token_offset, device=self.device),
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
        index = torch.tensor(keep, device=self.device)
        logits = self.model.compute_logits(hidden[index])
        return ForwardOutput(logits, [a[index] for a in aux])
