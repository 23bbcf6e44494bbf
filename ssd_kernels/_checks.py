"""Launcher validation shared by the kernels: each check raises ValueError naming the argument."""

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in allowed]}, got {t.dtype}")


def check_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {layout} ({ndim}-D), got shape {tuple(t.shape)}")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], layout: str) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must be {layout} = {expected}, got {tuple(t.shape)}")


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {t.stride()}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors must be on one device, got {devices}")
