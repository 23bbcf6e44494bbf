"""Weight-only quantized matmuls: int4 in groups along the input features, int8 per output channel.

Each runs a kernel (`kernel()`) where the device has one, with `reference()` beside it (dequantize, then
F.linear) that tests compare it with. int4 on CPU with the GGUF's own group-32 values: the project's kernel
(ssd/layers/cpu_kernels.py; float32 and 16-bit activations alike, each row on the same arithmetic whatever
the batch). Otherwise torch's packed weight-only kernels, whose CPU int4 / int8 versions have no fast float32
path (measured 10-40x slower than dequantizing for 8-40 rows, and linear in the rows): float32 activations run
the reference there, so a decode and a verify forward stay on the same arithmetic. The portable weights and
their int4 convention are in ssd/quantized_weights.py.
"""

import enum
from collections.abc import Callable

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from ssd.layers import cpu_kernels
from ssd.quantized_weights import Int4Weight, Int8Weight, unpack_int4_codes
from ssd_kernels.cpu.extension import AMX_BF16

log = structlog.get_logger(__name__)


class Int4Kernel(enum.Enum):
    """Which kernel an Int4Matmul runs for a few rows (`kernel_choice`), where the own CPU kernel holds its weight."""

    # float32 activations: own (torch's CPU alternative dequantizes the weight every call); bfloat16 on AVX512-BF16:
    # own (its bfloat16 kernel); other 16-bit: torch's int4pack, measured as fast or faster at 1 and 8 rows on an AMX
    # CPU than the own float path (docs/benchmarks.md), own where it has none
    AUTO = "auto"
    OWN = "own"  # own for every dtype: bfloat16 on its bfloat16 kernel where the CPU has one, else float activations
    OWN_INT8 = "own-int8"  # own; 16-bit activations rounded to int8 in groups of 32 (VNNI, as llama.cpp)
    TORCH = "torch"  # torch's int4pack (or the reference), never own


class Int4Matmul(nn.Module):
    """x @ w.T for a grouped int4 weight: the project's CPU kernel for a few rows where it holds the weight
    exactly and `kernel_choice` (Int4Kernel, default AUTO) says so, else torch's int4pack kernel where the device
    has one, else the reference.

    Torch's kernel layout is device-specific, so it is made again from the portable codes whenever the module
    moves (`.to(device)`); the own kernel's layout (made once, from the float32 scales) runs on CPU only.
    """

    def __init__(self, weight: Int4Weight, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.group_size = weight.group_size
        self.out_features, self.in_features = weight.codes.shape[0], 2 * weight.codes.shape[1]
        self.register_buffer("codes", weight.codes.to(device).contiguous())  # [N, K / 2] uint8
        sz = torch.stack([weight.scales.t(), weight.zeros.t()], -1)  # [K / g, N, 2], the kernel's layout
        self.register_buffer("scales_and_zeros", sz.to(device=device, dtype=dtype).contiguous())
        self.register_buffer("packed", None)
        own = _own_layout(weight) if device.type == "cpu" else None
        self.register_buffer("own_blocks", None if own is None else own[0], persistent=False)  # [N / 4, K / 64, 144]
        self.register_buffer("own_mins", None if own is None else own[1], persistent=False)  # [N, K / 32] fp16 bits
        own_bf16 = _own_bf16_layout(weight) if own is not None and dtype == torch.bfloat16 else None
        self.register_buffer("own_bf16_blocks", None if own_bf16 is None else own_bf16[0], persistent=False)
        self.own_bf16_path = 0 if own_bf16 is None else own_bf16[1]  # its blocks [N / 16, K / 32, 320]: their path
        self._own_calls: dict[torch.dtype, Callable[[torch.Tensor], torch.Tensor] | None] = {}  # eager, per dtype
        self.kernel_choice = Int4Kernel.AUTO
        self._repack()

    @property
    def kernel_choice(self) -> Int4Kernel:
        return self._kernel_choice

    @kernel_choice.setter
    def kernel_choice(self, choice: Int4Kernel) -> None:
        self._kernel_choice = choice
        self._own_calls.clear()

    @property
    def has_own_kernel(self) -> bool:
        """Whether the own CPU kernel holds this weight (and runs here)."""
        return self.own_blocks is not None and self.codes.device.type == "cpu"

    def runs_own_kernel(self, dtype: torch.dtype) -> bool:
        """Whether activations of `dtype` run the own kernel (its float paths up to cpu_kernels.MAX_ROWS rows, its
        bfloat16 kernel any number)."""
        if not self.has_own_kernel or self.kernel_choice == Int4Kernel.TORCH:
            return False
        return (self.kernel_choice != Int4Kernel.AUTO or dtype == torch.float32 or self.packed is None
                or self._runs_bf16_kernel(dtype))

    def _runs_bf16_kernel(self, dtype: torch.dtype) -> bool:
        """Whether the own kernel runs activations of `dtype` on its bfloat16 kernel (bfloat16, AVX512-BF16)."""
        return (dtype == torch.bfloat16 and self.own_bf16_blocks is not None
                and self.kernel_choice in (Int4Kernel.AUTO, Int4Kernel.OWN))

    def _repack(self) -> None:
        self.packed = _int4_kernel_layout(self.codes, self.scales_and_zeros.dtype)  # None: no kernel here
        self._own_calls.clear()

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def] - nn.Module's own signature
        super()._apply(fn, recurse)
        self._repack()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        # the bfloat16 kernel serves any number of rows (2x torch's int4pack from 16 to 256 rows on Zen 4,
        # docs/benchmarks.md); the float path re-reads the weight for every 4 rows and leaves prefills to torch
        if x.shape[0] <= cpu_kernels.MAX_ROWS or self._runs_bf16_kernel(x.dtype):
            if not torch.compiler.is_compiling():  # eager: the kernel call for this dtype, looked up once
                if x.dtype not in self._own_calls:
                    self._own_calls[x.dtype] = self._own_call(x.dtype)
                call = self._own_calls[x.dtype]
                if call is not None:
                    return call(x)
            elif self.runs_own_kernel(x.dtype):
                return self.own_kernel(x)
        if self.packed is None or x.dtype != self.scales_and_zeros.dtype or x.dtype == torch.float32:
            return self.reference(x)
        return self.kernel(x)

    def _own_call(self, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if not self.runs_own_kernel(dtype):
            return None
        if self._runs_bf16_kernel(dtype):
            return cpu_kernels.int4_bf16_call(self.own_bf16_blocks, self.own_bf16_path)
        return cpu_kernels.int4_call(self.own_blocks, self.own_mins, dtype, self.kernel_choice == Int4Kernel.OWN_INT8)

    def cpu_op(self, dtype: torch.dtype, few_rows: bool) -> tuple[cpu_kernels.LinearKind, torch.Tensor,
                                                                   torch.Tensor | None, int] | None:
        """(kind, weight, aux, param) of the fused CPU layer op that computes what `forward` computes for x of
        `dtype` with up to (`few_rows`) or more than cpu_kernels.MAX_ROWS rows; None where forward dequantizes."""
        ext = cpu_kernels.extension()
        if ext is not None and self._runs_bf16_kernel(dtype):
            return cpu_kernels.LinearKind.INT4_BF16, self.own_bf16_blocks, None, self.own_bf16_path
        if few_rows and ext is not None and self.runs_own_kernel(dtype):
            path = cpu_kernels.path_for(ext, dtype, self.kernel_choice == Int4Kernel.OWN_INT8)
            return cpu_kernels.LinearKind.INT4_OWN, self.own_blocks, self.own_mins, path
        if (self.packed is None or dtype != self.scales_and_zeros.dtype or dtype == torch.float32
                or self.codes.device.type != "cpu"):
            return None
        return cpu_kernels.LinearKind.INT4_PACK, self.packed, self.scales_and_zeros, self.group_size

    def own_kernel(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if self._runs_bf16_kernel(x.dtype):
            return cpu_kernels.int4_bf16_matmul(x, self.own_bf16_blocks, self.own_bf16_path)
        return cpu_kernels.int4_matmul(x, self.own_blocks, self.own_mins, self.kernel_choice == Int4Kernel.OWN_INT8)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if x.device.type == "cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        return torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group_size, self.scales_and_zeros)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize (with the scales in x's dtype, as the kernel reads them), then F.linear."""
        sz = self.scales_and_zeros  # [K / g, N, 2]
        w = Int4Weight(self.codes, sz[..., 0].t(), sz[..., 1].t()).dequantize(torch.float32)  # [N, K]
        return F.linear(x, w.to(x.dtype))

    def kernel_name(self) -> str:
        """What activations of the model's dtype run on: "own AMX tiles", "own bfloat16 loop", "own int8
        activations", "own float", "torch int4pack" or "reference"."""
        dtype = self.scales_and_zeros.dtype
        if self._runs_bf16_kernel(dtype):
            return "own AMX tiles" if self.own_bf16_path == AMX_BF16 else "own bfloat16 loop"
        if self.runs_own_kernel(dtype):
            return "own int8 activations" if self.kernel_choice == Int4Kernel.OWN_INT8 else "own float"
        return "reference" if self.packed is None else "torch int4pack"

    def extra_repr(self) -> str:
        kernel = "reference" if self.packed is None else "int4pack"
        if self.has_own_kernel and self.kernel_choice != Int4Kernel.TORCH:
            tiles = " on AMX tiles" if self.own_bf16_path == AMX_BF16 else ""
            bf16 = f", bfloat16 kernel{tiles}" if self.own_bf16_blocks is not None else ""
            kernel = f"own ({self.kernel_choice.value}{bf16}) up to {cpu_kernels.MAX_ROWS} rows (bfloat16: all), else {kernel}"
        return f"in={self.in_features}, out={self.out_features}, group_size={self.group_size}, kernel={kernel}"


class Int8Matmul(nn.Module):
    """x @ w.T for a per-channel int8 weight, through torch's int8pack kernel."""

    def __init__(self, weight: Int8Weight, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.codes.shape
        self.register_buffer("codes", weight.codes.to(device).contiguous())
        self.register_buffer("scales", weight.scales.to(device=device, dtype=dtype))
        self.has_kernel = _int8_kernel_works(dtype, device)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def] - nn.Module's own signature
        super()._apply(fn, recurse)
        self.has_kernel = _int8_kernel_works(self.scales.dtype, self.codes.device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if not self.has_kernel or x.dtype != self.scales.dtype or x.dtype == torch.float32:
            return self.reference(x)
        return self.kernel(x)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)

    def cpu_op(self, dtype: torch.dtype, few_rows: bool) -> tuple[cpu_kernels.LinearKind, torch.Tensor, torch.Tensor,
                                                                   int] | None:
        """(kind, weight, aux, param) of the fused CPU layer op computing `forward` for x of `dtype`; None where
        forward dequantizes."""
        if not self.has_kernel or dtype != self.scales.dtype or dtype == torch.float32 or self.codes.device.type != "cpu":
            return None
        return cpu_kernels.LinearKind.INT8_PACK, self.codes, self.scales, 0

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, (self.codes.float() * self.scales.float()[:, None]).to(x.dtype))

    def extra_repr(self) -> str:
        kernel = "int8pack" if self.has_kernel else "reference"
        return f"in={self.in_features}, out={self.out_features}, kernel={kernel}"


def int4_kernels(model: nn.Module) -> str | None:
    """What the model's int4 linears run on, for the engine's ready log (Int4Matmul.kernel_name, several joined by
    " + "); None where it has no int4 linear."""
    names = {m.kernel_name() for m in model.modules() if isinstance(m, Int4Matmul)}
    return " + ".join(sorted(names)) or None


def _own_layout(weight: Int4Weight) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The own CPU kernel's layout of `weight`; None where it cannot hold it exactly or cannot be built here."""
    if weight.group_size != 32:
        return None
    layout = cpu_kernels.int4_layout(weight.scales, weight.zeros, weight.unpacked())
    if layout is None or cpu_kernels.extension() is None:
        return None
    return layout


def _own_bf16_layout(weight: Int4Weight) -> tuple[torch.Tensor, int] | None:
    """The own bfloat16-activation kernel's (blocks, path) for `weight`; None where it cannot hold it or this CPU
    lacks it."""
    if weight.group_size != 32:
        return None
    return cpu_kernels.int4_bf16_layout(weight.scales, weight.zeros, weight.unpacked())


def _int4_kernel_layout(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """codes [N, K / 2] in their device kernel's own layout; None where there is no kernel (the reference runs)."""
    try:
        if codes.device.type == "cpu":
            q = unpack_int4_codes(codes).to(torch.int32)  # [N, K]
            return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # [N, K / 2] uint8
        k = 2 * codes.shape[1]
        inner_k_tiles = next((t for t in (8, 4, 2) if k % (16 * t) == 0), None)
        if codes.device.type == "cuda" and dtype == torch.bfloat16 and inner_k_tiles is not None:
            return torch.ops.aten._convert_weight_to_int4pack(codes.contiguous(), inner_k_tiles)
    except (RuntimeError, AttributeError) as e:
        log.warning("int4 packing unavailable; using the dequantizing reference", error=str(e))
    return None


def _int8_kernel_works(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's int8pack kernel runs here (tried once on a tiny matrix)."""
    try:
        x = torch.zeros(1, 32, dtype=dtype, device=device)
        torch.ops.aten._weight_int8pack_mm(x, torch.zeros(8, 32, dtype=torch.int8, device=device),
                                           torch.ones(8, dtype=dtype, device=device))
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
