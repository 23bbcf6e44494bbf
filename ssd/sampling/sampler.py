"""From logits to the target distribution p (temperature, top-k, min-p, top-p) and to sampled tokens.

`target_probs` is the one definition of p used by plain sampling and, later, by verification.
Each sequence draws from its own torch.Generator, so a seeded request gives the same tokens
whatever else is in the batch. Logits and generators are on CPU whatever device the model runs on
(the model runner moves logits off the device), so the draws do not depend on the device either.
"""

import torch

from ssd.sampling.greedy import argmax_rows
from ssd.sampling.params import SamplingParams


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] logits of one sequence -> [N, V] float32 probabilities after its sampling params."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:  # [N, V] -> [N] int64
    """One draw per row of non-negative (not necessarily normalized) weights, by inverse CDF in float64.

    Exact: token i is drawn with probability probs[i] / sum(probs), and a zero-weight token never is.
    On CPU it is ~15x faster than `torch.multinomial` for one row of a 49k vocabulary (0.07 vs 1.0 ms).
    """
    return sample_from_each(probs, [generator], [probs.shape[0]])


def sample_from_each(probs: torch.Tensor, generators: list[torch.Generator | None],
                     sizes: list[int]) -> torch.Tensor:  # [N, V] -> [N] int64
    """`sample_from` over consecutive groups of rows (sizes[i] rows draw from generators[i]), in one cumsum and
    one search for all rows: each group's draws are those `sample_from` would make for it alone."""
    cdf = probs.double().cumsum(dim=-1)  # [N, V]
    u = torch.cat([torch.rand(n, 1, generator=g, dtype=torch.float64)
                   for g, n in zip(generators, sizes, strict=True)])  # [N, 1] in [0, 1)
    u = u * cdf[:, -1:]  # in [0, total) per row
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)


def sample_tokens(
    logits: torch.Tensor,  # [B, V], one row per sequence
    params: list[SamplingParams],
    generators: list[torch.Generator],
) -> list[int]:
    """One token per row: argmax for greedy rows, a draw from p otherwise."""
    greedy = argmax_rows(logits).tolist()
    out: list[int] = []
    for i, p in enumerate(params):
        if p.is_greedy:
            out.append(greedy[i])
        else:
            out.append(int(sample_from(target_probs(logits[i : i + 1], p), generators[i])[0]))
    return out
