"""Vocabulary-parallel embedding and LM head: rows split across the ranks of the current `TensorParallel`.

The LM head may also hold the checkpoint's own Q8_0 form of its weight (`use_q8`, the default model's GGUF
keeps it so): on CPU, forwards of up to cpu_kernels.MAX_ROWS rows then read those 8-bit blocks (a decode step
reads 30 MB instead of 113 MB of float32 or 57 MB of bfloat16); larger ones use the float weight, which holds the
same values (`use_q8` checks it).
"""

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from ssd.distributed import current_tp, divide
from ssd.layers import cpu_kernels
from ssd.layers.linear import pack_float, packed_linear
from ssd.quantized_weights import Q8Weight

log = structlog.get_logger(__name__)


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
    q8_blocks: torch.Tensor | None = None  # [V / size / 4, d / 32, 136]: this rank's rows in the q8 kernel's layout
    q8_bf16_blocks: torch.Tensor | None = None  # [V / size / 16, d / 32, 544]: in the q8 bfloat16 kernel's layout
    q8_bf16_path = 0  # the path of its kernel (BF16_AVX512 or AMX_BF16)
    own: cpu_kernels.OwnMatmul | None = None  # the own float kernel (set by `pack`)

    def pack(self) -> None:
        self.packed, self.own = pack_float(self.weight)

    def use_q8(self, weight: Q8Weight) -> bool:
        """Read `weight` (the whole vocabulary's Q8_0 head) for few-row forwards on CPU; False (and logged) where
        it is not this head's float weight quantized, or the kernel cannot hold it or run here."""
        codes, scales = (t.narrow(0, self.start, self.shard) for t in (weight.codes, weight.scales))
        if tuple(codes.shape) != tuple(self.weight.shape):
            log.warning("q8_0 LM head skipped: its shape differs", q8=list(codes.shape), head=list(self.weight.shape))
            return False
        if not torch.equal(Q8Weight(codes, scales).dequantize().to(self.weight.dtype), self.weight.detach()):
            log.warning("q8_0 LM head skipped: its values are not the float head's")
            return False
        if self.weight.device.type != "cpu":
            return False
        if self.weight.dtype == torch.bfloat16:  # bfloat16 hidden states: the bfloat16 kernel, where the CPU has it
            self.q8_bf16_blocks, self.q8_bf16_path = cpu_kernels.q8_bf16_layout(codes, scales) or (None, 0)
        if self.q8_bf16_blocks is None:
            self.q8_blocks = cpu_kernels.q8_layout(codes, scales)
        return self.q8_blocks is not None or self.q8_bf16_blocks is not None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, d] -> [N, V] float32
        few_rows = hidden.shape[0] <= cpu_kernels.MAX_ROWS and hidden.device.type == "cpu"
        if self.q8_bf16_blocks is not None and few_rows and hidden.dtype == torch.bfloat16:
            logits = cpu_kernels.q8_bf16_matmul(hidden, self.q8_bf16_blocks, self.q8_bf16_path)  # [N, V / size]
        elif self.q8_blocks is not None and few_rows:
            logits = cpu_kernels.q8_matmul(hidden, self.q8_blocks)  # [N, V / size]
        else:
            logits = packed_linear(hidden, self.packed, self.weight, None, self.own)  # [N, V / size]: this rank's
        return self.tp.all_gather_last(logits).float()
