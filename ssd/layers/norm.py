"""RMSNorm, with the residual add fused in (returns the normed value and the new residual).

On CPU it is one call of the project's layer op (ssd/layers/cpu_kernels.py); `_norm` is the torch version.
"""

import torch
from torch import nn

from ssd.layers import cpu_kernels


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual)."""
        ops = cpu_kernels.layer_ops_for(x, self.weight, *(() if residual is None else (residual,)))
        if ops is not None and x.dim() == 2 and self.weight.dtype == x.dtype:
            outs = ops.rms_norm(x.contiguous(), None if residual is None else residual.contiguous(), self.weight,
                                self.eps)
            return outs[0] if residual is None else (outs[0], outs[1])
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
