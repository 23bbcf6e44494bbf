"""Saguaro sampling (SSD.md section 5): scale the draft's top-F probabilities by C before sampling.

On a rejection the bonus token comes from the residual max(0, p - q). Scaling down q on exactly the
tokens the speculation cache forks on moves residual mass onto them, so a rejection's bonus lands in
the cache more often. The draft samples from the scaled q and sends it as q, so the verifier's ratio
test uses the same distribution and the output stays exactly p-distributed for any C in (0, 1].
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SaguaroScale:
    """What a proposer applies to its draft distribution at each chain step: scale the top tops[step] by c."""

    c: float
    tops: tuple[int, ...]  # per draft step (F_j + 1: the guesses at acceptance length j and s_{j+1} itself)

    def apply(self, probs: torch.Tensor, step: int) -> torch.Tensor:  # [..., V] -> [..., V]
        top = self.tops[min(step, len(self.tops) - 1)] if self.tops else 0
        return saguaro_scale(probs.reshape(-1, probs.shape[-1]), top, self.c).reshape(probs.shape)


def saguaro_scale(probs: torch.Tensor, top: int, c: float) -> torch.Tensor:
    """probs [N, V] -> [N, V]: the `top` most likely tokens of each row scaled by c, renormalized."""
    if c >= 1.0 or top <= 0:
        return probs
    idx = probs.topk(min(top, probs.shape[-1]), dim=-1).indices  # [N, top]
    scaled = probs.clone()
    scaled.scatter_(-1, idx, probs.gather(-1, idx) * c)
    return scaled / scaled.sum(dim=-1, keepdim=True)
