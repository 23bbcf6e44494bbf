"""Categorical sampling by inverse CDF: the right frequencies per row, never a zero-weight token, seeded."""

import torch

from ssd.sampling.sampler import sample_from, sample_from_each


def test_frequencies_match_the_weights_row_by_row():
    weights = torch.tensor([[0.2, 0.0, 0.5, 0.3], [0.0, 4.0, 0.0, 1.0]])  # rows need not sum to 1
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_from(weights, g) for _ in range(20000)])  # [n, 2]
    for row, want in enumerate(weights / weights.sum(-1, keepdim=True)):
        freq = torch.bincount(draws[:, row], minlength=4).double() / len(draws)
        assert torch.allclose(freq, want.double(), atol=0.015), (row, freq)
        assert freq[want == 0].sum() == 0  # zero-weight tokens are never drawn


def test_one_hot_and_same_seed_same_draws():
    one_hot = torch.zeros(3, 49152)
    one_hot[torch.arange(3), torch.tensor([0, 7, 49151])] = 1.0
    assert sample_from(one_hot, torch.Generator().manual_seed(1)).tolist() == [0, 7, 49151]
    probs = torch.softmax(torch.randn(4, 1000), -1)
    a = sample_from(probs, torch.Generator().manual_seed(5))
    assert torch.equal(a, sample_from(probs, torch.Generator().manual_seed(5)))


def test_grouped_draws_are_each_groups_own():
    """sample_from_each over several requests' rows draws exactly what sample_from draws for each alone."""
    probs = torch.softmax(torch.randn(7, 500, generator=torch.Generator().manual_seed(2)), -1)
    sizes, seeds = [3, 1, 3], [11, 12, 13]
    together = sample_from_each(probs, [torch.Generator().manual_seed(s) for s in seeds], sizes)
    alone = torch.cat([sample_from(rows, torch.Generator().manual_seed(s))
                       for rows, s in zip(probs.split(sizes), seeds, strict=True)])
    assert torch.equal(together, alone)
