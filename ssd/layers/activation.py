"""SiLU-and-multiply over a fused gate-up projection output."""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, 2*I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
