"""The trimmed draft vocabulary: the target tokens carrying the most of the target's next-token probability.

Maps (EAGLE-3 convention): `d2t[draft_id] = target_id - draft_id` and `t2d[target_id] = is in the draft vocab`;
draft ids are the chosen target ids in increasing order, so both maps are monotone and invertible.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftVocab:
    target_ids: torch.Tensor  # [draft_vocab] int64, increasing: draft id i <-> target id target_ids[i]
    vocab_size: int  # the target's vocabulary size
    coverage: float  # fraction of the target's probability mass (measured on the training data) covered

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    @property
    def d2t(self) -> torch.Tensor:  # [draft_vocab] int64
        return self.target_ids - torch.arange(self.size)

    @property
    def t2d(self) -> torch.Tensor:  # [vocab] bool
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.target_ids] = True
        return mask

    def target_to_draft(self) -> torch.Tensor:  # [vocab] int64: draft id of each target id, -1 when absent
        index = torch.full((self.vocab_size,), -1, dtype=torch.long)
        index[self.target_ids] = torch.arange(self.size)
        return index


def token_mass(topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, vocab_size: int,
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """Summed target probability per token: topk_ids / topk_logprobs [N, k], weights [N] -> [vocab] float64."""
    probs = topk_logprobs.double().exp()  # [N, k]
    if weights is not None:
        probs = probs * weights.double()[:, None]
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    mass.index_add_(0, topk_ids.reshape(-1).long(), probs.reshape(-1))
    return mass


def choose_draft_vocab(mass: torch.Tensor, total_mass: float, coverage: float, min_size: int,
                       max_size: int) -> DraftVocab:
    """The smallest top-mass set covering `coverage` of `total_mass`, clamped to [min_size, max_size] tokens.

    `total_mass` is the full probability (1 per weighted position), so mass outside the stored top-k counts
    as uncovered and the reported coverage is a lower bound.
    """
    order = mass.argsort(descending=True, stable=True)  # [vocab]
    covered = mass[order].cumsum(0) / total_mass  # [vocab]
    needed = int((covered < coverage).sum()) + 1
    size = max(min(needed, max_size), min(min_size, mass.numel()))
    size = min(size, mass.numel())
    chosen = order[:size].sort().values
    return DraftVocab(chosen, mass.numel(), float(covered[size - 1]))
