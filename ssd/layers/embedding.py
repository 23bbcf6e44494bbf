"""Vocabulary-parallel embedding and LM head: rows split across the ranks of the current `TensorParallel`."""

import torch
import torch.nn.functional as F
from torch import nn

from ssd.distributed import current_tp, divide
from ssd.layers.linear import onednn_pack, packed_linear


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.tp = current_tp()
        self.vocab_size = vocab_size
        self.shard = divide(vocab_size, self.tp.size, "vocab_size")
        self.start = self.tp.rank * self.shard
        self.weight = nn.Parameter(torch.empty(self.shard, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded.narrow(0, self.start, self.shard))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, d]
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        mask = (ids >= self.start) & (ids < self.start + self.shard)  # [T]: rows this rank holds
        y = F.embedding((ids - self.start) * mask, self.weight) * mask.unsqueeze(-1)  # [T, d], zero elsewhere
        return self.tp.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    packed: torch.Tensor | None = None

    def pack(self) -> None:
        self.packed = onednn_pack(self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, V] float32
        logits = packed_linear(hidden, self.packed, self.weight, None)  # [N, V / size]: this rank's rows
        return self.tp.all_gather_last(logits).float()
