"""Weight-only quantized linear weights: int8 per output channel, int4 in groups along the input features.

Each weight has a portable form (what is cached on disk and sharded: output features on dim 0, input features
on dim 1) and a kernel layout made from it once, on the device it runs on. The kernels are torch's packed
weight-only matmuls; `reference()` beside each (dequantize, then F.linear) is what tests compare them with.

int4 convention (torch's int4pack kernels): w = (q - 8) * scale + zero, q in 0..15, one (scale, zero) per
`group_size` input features. GGUF Q4_1 (w = d * q + m) maps exactly to scale = d, zero = m + 8 d; Q4_0
(w = d * (q - 8)) to scale = d, zero = 0. Codes pack two per byte, the even input feature in the high nibble.
"""

from dataclasses import dataclass

import structlog
import torch
import torch.nn.functional as F
from torch import nn

log = structlog.get_logger(__name__)

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4pack kernels take


@dataclass(frozen=True)
class Int4Weight:
    """A grouped int4 weight in its portable form."""

    codes: torch.Tensor  # [N, K / 2] uint8: q of input feature 2j in the high nibble, 2j + 1 in the low one
    scales: torch.Tensor  # [N, K / group_size] float32
    zeros: torch.Tensor  # [N, K / group_size] float32, in the (q - 8) * scale + zero convention

    @property
    def group_size(self) -> int:
        return 2 * self.codes.shape[1] // self.scales.shape[1]

    def unpacked(self) -> torch.Tensor:  # [N, K] int32, 0..15
        high, low = (self.codes >> 4).to(torch.int32), (self.codes & 0xF).to(torch.int32)
        return torch.stack([high, low], dim=-1).flatten(1)

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        g = self.group_size
        q = self.unpacked().float()  # [N, K]
        return (q - 8) * self.scales.repeat_interleave(g, 1) + self.zeros.repeat_interleave(g, 1)


@dataclass(frozen=True)
class Int8Weight:
    """A symmetric per-output-channel int8 weight: w = q * scale."""

    codes: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N] float32

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        return self.codes.float() * self.scales[:, None]


def pack_int4_codes(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] integers in 0..15 -> [N, K / 2] uint8, the even input feature in the high nibble."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] << 4) | q[:, 1::2]


def quantize_int4(weight: torch.Tensor, group_size: int) -> Int4Weight:
    """Asymmetric min/max int4 of weight [N, K] in groups of `group_size` input features (like GGUF Q4_1)."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)  # [N, G, g]
    low, high = groups.amin(-1), groups.amax(-1)  # [N, G]
    scales = (high - low) / 15
    q = ((groups - low[..., None]) / scales.clamp_min(1e-30)[..., None]).round().clamp(0, 15)  # [N, G, g]
    return Int4Weight(pack_int4_codes(q.reshape(n, k)), scales, low + 8 * scales)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 of weight [N, K]."""
    w = weight.float()
    scales = w.abs().amax(1) / 127  # [N]
    q = (w / scales.clamp_min(1e-30)[:, None]).round().clamp(-127, 127).to(torch.int8)
    return Int8Weight(q, scales)


class Int4Matmul(nn.Module):
    """x @ w.T for a grouped int4 weight, through torch's int4pack kernel where the device has one.

    The kernel layout is device-specific, so it is made again from the portable codes whenever the module
    moves (`.to(device)`).
    """

    def __init__(self, weight: Int4Weight, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.group_size = weight.group_size
        self.out_features, self.in_features = weight.codes.shape[0], 2 * weight.codes.shape[1]
        self.register_buffer("codes", weight.codes.to(device).contiguous())  # [N, K / 2] uint8
        sz = torch.stack([weight.scales.t(), weight.zeros.t()], -1)  # [K / g, N, 2], the kernel's layout
        self.register_buffer("scales_and_zeros", sz.to(device=device, dtype=dtype).contiguous())
        self.register_buffer("packed", None)
        self._repack()

    def _repack(self) -> None:
        self.packed = _int4_kernel_layout(self.codes, self.scales_and_zeros.dtype)  # None: no kernel here

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def] - nn.Module's own signature
        super()._apply(fn, recurse)
        self._repack()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        if self.packed is None or x.dtype != self.scales_and_zeros.dtype:
            return self.reference(x)
        if x.device.type == "cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        return torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group_size, self.scales_and_zeros)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize (with the scales in x's dtype, as the kernel reads them), then F.linear."""
        sz = self.scales_and_zeros.float()  # [K / g, N, 2]
        w = Int4Weight(self.codes, sz[..., 0].t(), sz[..., 1].t()).dequantize()  # [N, K] float32
        return F.linear(x, w.to(x.dtype))

    def extra_repr(self) -> str:
        kernel = "reference" if self.packed is None else "int4pack"
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
        if not self.has_kernel or x.dtype != self.scales.dtype:
            return self.reference(x)
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, (self.codes.to(x.dtype) * self.scales[:, None]).to(x.dtype))

    def extra_repr(self) -> str:
        kernel = "int8pack" if self.has_kernel else "reference"
        return f"in={self.in_features}, out={self.out_features}, kernel={kernel}"


def _int4_kernel_layout(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """codes [N, K / 2] in their device kernel's own layout; None where there is no kernel (the reference runs)."""
    try:
        if codes.device.type == "cpu":
            q = torch.stack([codes >> 4, codes & 0xF], dim=-1).flatten(1).to(torch.int32)  # [N, K]
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
