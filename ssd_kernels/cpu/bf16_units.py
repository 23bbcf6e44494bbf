"""The unit order of the AVX512-BF16 kernels of quantized weights (int4_bf16_gemm, q8_bf16_gemm): blocks of 16 output
features come in units of 4 (the last may hold fewer), and a unit's blocks are interleaved group by group, so that a
unit reads one sequential stream (ssd_kernels/cpu/bf16_dot_units.h)."""

import torch

UNIT = 4  # blocks per unit


def interleave_units(blocks: torch.Tensor) -> torch.Tensor:
    """blocks [B, G, bytes] in block order -> the same shape, each unit's memory [group][block of the unit][bytes]."""
    units = [blocks[u : u + UNIT].transpose(0, 1).reshape(-1, blocks.shape[1], blocks.shape[2])
             for u in range(0, blocks.shape[0], UNIT)]  # a unit's [G, fb, bytes], viewed as [fb, G, bytes]
    return torch.cat(units).contiguous()


def deinterleave_units(blocks: torch.Tensor) -> torch.Tensor:
    """The inverse of `interleave_units`: blocks [B, G, bytes] in block order."""
    nb, groups, size = blocks.shape
    units = []
    for u in range(0, nb, UNIT):
        fb = min(UNIT, nb - u)
        units.append(blocks[u : u + fb].reshape(groups, fb, size).transpose(0, 1))
    return torch.cat(units).contiguous()


def check_operands(name: str, x: torch.Tensor, blocks: torch.Tensor, group: int, group_bytes: int) -> None:
    """Raise ValueError unless x [M, K] and blocks [N / 16, K / group, group_bytes] match (`name`: the kernel's)."""
    k = x.shape[-1]
    if x.dim() != 2 or blocks.dim() != 3 or k % group or tuple(blocks.shape[1:]) != (k // group, group_bytes):
        raise ValueError(f"{name}: x [M, K] and blocks [N/16, K/{group}, {group_bytes}] do not match: "
                         f"{tuple(x.shape)}, {tuple(blocks.shape)}")
