"""Vocabulary-parallel embedding and LM head (rows split across ranks; world size 1 today)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ssd.distributed import tp_rank, tp_size
from ssd.layers.linear import onednn_pack, packed_linear


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        n = tp_size()
        if vocab_size % n:
            raise ValueError(f"vocab size {vocab_size} is not divisible by the tensor-parallel size {n}")
        self.vocab_size = vocab_size
        self.shard = vocab_size // n
        self.start = tp_rank() * self.shard
        self.weight = nn.Parameter(torch.empty(self.shard, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded.narrow(0, self.start, self.shard))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, d]
        if tp_size() == 1:
            return F.embedding(ids, self.weight)
        mask = (ids >= self.start) & (ids < self.start + self.shard)
        y = F.embedding((ids - self.start) * mask, self.weight) * mask.unsqueeze(-1)
        dist.all_reduce(y)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    packed: torch.Tensor | None = None

    def pack(self) -> None:
        self.packed = onednn_pack(self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, V] float32
        logits = packed_linear(hidden, self.packed, self.weight, None)
        if tp_size() > 1:
            parts = [torch.empty_like(logits) for _ in range(tp_size())]
            dist.all_gather(parts, logits)
            logits = torch.cat(parts, dim=-1)
        return logits.float()
