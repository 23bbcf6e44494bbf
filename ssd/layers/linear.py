"""Tensor-parallel-ready linear layers (vLLM-style), correct at any world size, used at 1 today.

Column-parallel layers split the output features across ranks, row-parallel layers split the
input features and sum partial results. Each parameter carries a `weight_loader` that takes the
full checkpoint tensor and keeps this rank's shard; packed layers (fused QKV, fused gate-up) also
take a shard id naming which checkpoint tensor is being loaded.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ssd.distributed import all_reduce, tp_rank, tp_size


def _divide(n: int, d: int) -> int:
    if n % d:
        raise ValueError(f"{n} is not divisible by the tensor-parallel size {d}")
    return n // d


class _Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)


class ReplicatedLinear(_Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(_Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, _divide(out_features, tp_size()), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        shard = param.shape[0]
        param.data.copy_(loaded.narrow(0, tp_rank() * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one matmul (e.g. gate and up projections)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:  # type: ignore[override]
        n = tp_size()
        offset = sum(self.out_sizes[:shard_id]) // n
        size = self.out_sizes[shard_id] // n
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, tp_rank() * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused query/key/value projection; heads are split across ranks."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> None:
        n = tp_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, n)
        self.num_kv_heads = _divide(num_kv_heads, n)
        super().__init__(hidden, (num_heads + 2 * num_kv_heads) * head_dim, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:  # type: ignore[override]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, tp_rank() * size, size))


class RowParallelLinear(_Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(_divide(in_features, tp_size()), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 1:  # bias: added once, on rank 0
            param.data.copy_(loaded if tp_rank() == 0 else torch.zeros_like(loaded))
            return
        shard = param.shape[1]
        param.data.copy_(loaded.narrow(1, tp_rank() * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if tp_rank() == 0 else None)
        return all_reduce(y)
