"""Tensor-parallel linear layers (vLLM-style): sharded for the `TensorParallel` current when they are built.

Column-parallel layers split the output features across ranks, row-parallel layers split the
input features and sum partial results. Each parameter carries a `weight_loader` that takes the
full checkpoint tensor and keeps this rank's shard; packed layers (fused QKV, fused gate-up) also
take a shard id naming which checkpoint tensor is being loaded. At size 1 they are plain linears.
A layer may swap its float weight for a quantized one (`use_quantized`, after loading); the same weight
loaders shard the quantized tensors, which keep output features on dim 0 and input features on dim 1.
"""

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from ssd.distributed import current_tp, divide
from ssd.errors import CheckpointError
from ssd.layers import cpu_kernels
from ssd.layers.quantized_linear import Int4Matmul, Int8Matmul

log = structlog.get_logger(__name__)


def onednn_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight reordered into oneDNN's blocked layout (CPU), or None where that is unavailable.

    On these CPUs a packed bf16 or fp32 matmul runs ~1.6-2x faster than `F.linear` for 1..8 rows
    and gives the same bf16 results (measured; see docs/benchmarks.md).
    """
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
    except (RuntimeError, AttributeError) as e:
        log.warning("oneDNN weight packing unavailable; using F.linear", error=str(e))
        return None


def packed_linear(x: torch.Tensor, packed: torch.Tensor | None, weight: torch.Tensor,
                  bias: torch.Tensor | None, own: cpu_kernels.OwnMatmul | None = None) -> torch.Tensor:
    """x @ weight.T + bias: on the own kernel where it serves x, else through the packed weight when there is one.
    x: [N, in] -> [N, out]."""
    if own is not None and own.serves(x):
        y = own(x)
        return y if bias is None else y + bias
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_float(weight: torch.Tensor) -> tuple[torch.Tensor | None, cpu_kernels.OwnMatmul | None]:
    """(oneDNN's packed weight, the own kernel) for an inference weight: the own kernel where one serves it, and
    oneDNN's packing where the own kernel leaves some row counts to it."""
    own = cpu_kernels.own_matmul_for(weight)
    return (None if own is not None and own.max_rows is None else onednn_pack(weight)), own


class _Linear(nn.Module):
    packed: torch.Tensor | None = None
    own: cpu_kernels.OwnMatmul | None = None  # the own float kernel (set by `pack`)

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.quantized: Int4Matmul | Int8Matmul | None = None  # a submodule once set (not a class attribute)
        self.tp = current_tp()  # the ranks this layer is sharded over (size 1: whole)
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    def pack(self) -> None:
        """Prepare the loaded weight for fast inference matmuls (call after loading); quantized: no-op."""
        if self.quantized is None:
            self.packed, self.own = pack_float(self.weight)

    def use_quantized(self, matmul: Int4Matmul | Int8Matmul) -> None:
        """Run on `matmul` (this rank's shard, quantized) from now on; the float weight is dropped."""
        if (matmul.out_features, matmul.in_features) != tuple(self.weight.shape):
            raise CheckpointError(f"quantized weight {matmul.out_features}x{matmul.in_features} "
                                  f"!= {tuple(self.weight.shape)}")
        self.quantized = matmul
        self.packed = self.own = None
        self.weight = None  # type: ignore[assignment]

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # [N, in] -> [N, out]
        if self.quantized is None:
            return packed_linear(x, self.packed, self.weight, bias, self.own)
        y = self.quantized(x)
        return y if bias is None else y + bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def cpu_op(self, dtype: torch.dtype, few_rows: bool) -> object | None:
        """This layer's forward as the CPU extension's Linear, for x of `dtype` with up to (`few_rows`) or more than
        cpu_kernels.MAX_ROWS rows: the same arithmetic as `forward`. None where it is sharded over ranks (forward
        reduces across them), runs off the CPU, or dequantizes its weight per call."""
        ext = cpu_kernels.extension()
        if ext is None or self.tp.size != 1:
            return None
        if self.quantized is None:
            if self.weight.device.type != "cpu" or self.weight.dtype != dtype:
                return None
            own = self.own
            if own is not None and (few_rows or own.max_rows is None):
                return cpu_kernels.linear_op(ext, own.kind, own.tensor, bias=self.bias, param=own.path)
            if self.packed is not None:
                return cpu_kernels.linear_op(ext, cpu_kernels.LinearKind.PACKED, self.packed, bias=self.bias)
            return cpu_kernels.linear_op(ext, cpu_kernels.LinearKind.DENSE, self.weight, bias=self.bias)
        found = self.quantized.cpu_op(dtype, few_rows)
        if found is None:
            return None
        kind, weight, aux, param = found
        return cpu_kernels.linear_op(ext, kind, weight, aux, self.bias, param)


class ReplicatedLinear(_Linear):
    pass


class ColumnParallelLinear(_Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, divide(out_features, current_tp().size, "output features"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        shard = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp.rank * shard, shard))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one matmul (e.g. gate and up projections)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:  # type: ignore[override]
        n = self.tp.size
        offset = sum(self.out_sizes[:shard_id]) // n
        size = self.out_sizes[shard_id] // n
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp.rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused query/key/value projection; heads are split across ranks."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> None:
        n = current_tp().size
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, n, "num_attention_heads")
        self.num_kv_heads = divide(num_kv_heads, n, "num_key_value_heads")
        super().__init__(hidden, (num_heads + 2 * num_kv_heads) * head_dim, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:  # type: ignore[override]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp.rank * size, size))


class RowParallelLinear(_Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(divide(in_features, current_tp().size, "input features"), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 1:  # bias: added once, on rank 0
            param.data.copy_(loaded if self.tp.rank == 0 else torch.zeros_like(loaded))
            return
        shard = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.tp.rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.bias if self.tp.rank == 0 else None)
        return self.tp.all_reduce(y)


def quantizable_linears(model: nn.Module) -> list[tuple[str, _Linear]]:
    """The (name, layer) of every linear layer of `model` that still runs on a float weight."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, _Linear) and m.quantized is None]


def pack_linear_weights(model: nn.Module) -> int:
    """Pack every linear layer's weight (and the LM head's) for fast CPU matmuls; returns how many."""
    count = 0
    for module in model.modules():
        pack = getattr(module, "pack", None)
        if callable(pack):
            pack()
            count += getattr(module, "packed", None) is not None
    return count
