"""The greedy token of each row of logits: the project's CPU kernel where it serves (float32 CPU logits, in a process
that loaded the kernels), else torch.argmax.

torch's CPU argmax compares one element at a time: a batch-16 verify's 80 rows of 49,152 float32 logits took 5-10 ms
on one Sapphire Rapids core (an SSD round there is ~85 ms), its max over the same rows 0.5 ms. The kernel
(ssd_kernels/cpu/row_argmax.cpp) compares 8 or 16 lanes at a time and answers as torch.argmax does: the first index
of the largest value, a NaN counting as the largest. So every greedy token stays what it was, bit for bit.
"""

from functools import cache
from types import ModuleType

import torch

from ssd.layers import cpu_kernels
from ssd_kernels.cpu.extension import float_path


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
    """torch.argmax(logits, dim=-1) of a 2-D tensor."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 and logits.shape[-1]:
        ext = cpu_kernels.loaded_extension()
        if ext is not None:
            return ext.argmax_rows(logits.contiguous(), _path(ext))
    return logits.argmax(dim=-1)


@cache
def _path(ext: ModuleType) -> int:
    return float_path(ext)
