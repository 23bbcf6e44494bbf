"""Presence and frequency penalties (OpenAI semantics): lower the logit of every token the answer already holds,
by `presence_penalty` once and by `frequency_penalty` per occurrence. Only generated tokens count, not the prompt.

Applied before temperature, top-k and top-p, wherever the target's distribution is needed: plain sampling and
verification. A speculative round scores each draft position with the answer as it would stand there (the
committed tokens plus the path to that node), so speculation stays exact with penalties on.
"""

import torch

from ssd.sampling.params import SamplingParams


def has_penalties(params: SamplingParams) -> bool:
    return params.presence_penalty != 0 or params.frequency_penalty != 0


def apply_penalties(
    logits: torch.Tensor,  # [n, V]
    output_ids: list[int],  # generated tokens before row 0
    paths: list[list[int]],  # [n]: tokens between the committed ones and row i's position (row 0: [])
    params: SamplingParams,
) -> torch.Tensor:  # [n, V] float32
    """Row i penalized by the counts of output_ids + paths[i]; the logits unchanged without penalties."""
    if not has_penalties(params):
        return logits
    n, vocab = logits.shape
    base = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab).float()  # [V]
    counts = base.expand(n, vocab).clone()  # [n, V]
    for i, path in enumerate(paths):
        if path:
            counts[i] += torch.bincount(torch.tensor(path, dtype=torch.long), minlength=vocab).float()
    return logits.float() - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
