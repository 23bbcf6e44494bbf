"""The dtype names configs accept, and what "auto" (the default) picks for the device a model runs on.

bfloat16 halves the bytes a forward reads, but only pays where the hardware multiplies bfloat16 natively:
CUDA GPUs, and CPUs whose oneDNN build has a bfloat16 path (AVX-512 BW/VL/DQ, AVX-NE-CONVERT, AMX). On an
AVX2-only CPU (e.g. AMD Zen 3) oneDNN has none, and a bfloat16 matmul of 5-512 rows ran ~7x slower than
float32 there (docs/benchmarks.md, "dtype auto"), so "auto" picks float32 on such a CPU.
"""

import functools

import torch

from ssd.errors import InvalidRequestError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
AUTO = "auto"
DTYPE_CHOICES = [AUTO, *DTYPES]  # what the command-line flags offer


@functools.cache
def cpu_has_fast_bfloat16() -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (oneDNN's own check); asked once per process."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):  # a torch build without oneDNN
        return False


def auto_dtype_name(device: torch.device | str = "cpu") -> str:
    """The dtype "auto" means on `device`: bfloat16 where it is native, float32 elsewhere."""
    if torch.device(device).type == "cuda":
        return "bfloat16"
    return "bfloat16" if cpu_has_fast_bfloat16() else "float32"


def resolve_dtype_name(name: str, device: torch.device | str = "cpu") -> str:
    """`name` with "auto" replaced by the device's choice; InvalidRequestError for an unknown name."""
    if name == AUTO:
        return auto_dtype_name(device)
    if name not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return name


def parse_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    """The torch dtype for a config's dtype name ("auto" resolved for `device`)."""
    return DTYPES[resolve_dtype_name(name, device)]


def dtype_name(dtype: torch.dtype) -> str:
    """The config name of a torch dtype (torch.float32 -> "float32")."""
    return str(dtype).removeprefix("torch.")
