"""SSD fan-out math (SSD.md section 5), the tree mask of section 4, and the online a / r estimates."""

import pytest
import torch

from ssd.errors import InvalidRequestError
from ssd.speculation.fanout import FanOutEstimator, expected_hit_rate, geometric_fan_out, uniform_fan_out
from ssd.speculation.saguaro import saguaro_scale
from ssd.speculation.tree_mask import branch_mask


@pytest.mark.parametrize("a", [0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("r", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("k,budget", [(1, 4), (4, 8), (5, 24), (7, 30)])
def test_geometric_budget_and_monotone(a, r, k, budget):
    shape = geometric_fan_out(a, r, k, budget)
    assert len(shape) == k + 1
    assert sum(shape) == budget
    assert all(f >= 0 for f in shape)
    assert all(shape[j] >= shape[j + 1] for j in range(k - 1))  # non-increasing for j < K


def test_geometric_matches_closed_form_including_the_k_term():
    a, r, k, budget = 0.7, 1.0, 3, 1000  # a large budget makes rounding negligible
    shape = geometric_fan_out(a, r, k, budget)
    e = 1 / (1 + r)
    weights = [a ** (j * e) for j in range(k)] + [a ** (k * e) * (1 - a) ** (-e)]
    f0 = budget / sum(weights)
    for got, w in zip(shape, weights, strict=True):
        assert abs(got - f0 * w) <= 1.0
    assert shape[k] > shape[k - 1]  # P(K) = a^K exceeds (1-a) a^(K-1) when a > 0.5


def test_geometric_beats_uniform_under_its_model():
    a, r, k, budget = 0.6, 0.8, 5, 18
    assert expected_hit_rate(geometric_fan_out(a, r, k, budget), a, r) >= \
        expected_hit_rate(uniform_fan_out(k, budget), a, r)


def test_uniform_and_errors():
    assert uniform_fan_out(3, 8) == (2, 2, 2, 2)
    assert sum(uniform_fan_out(4, 7)) == 7
    with pytest.raises(InvalidRequestError):
        geometric_fan_out(0.5, 1.0, -1, 4)


def test_estimator_learns_acceptance_and_power_law():
    est = FanOutEstimator()
    for _ in range(2000):  # accept 3 of 4 every round: a -> 3 / (3 + 1)
        est.record_round(4, 3)
    assert abs(est.a - 0.75) < 0.01
    r_true = 1.0  # miss(F) = 1/F: rank F-1 has probability 1/(F-1) - 1/F = 1/(F(F-1))
    for rank in range(1, 64):
        est.rank_counts[rank] = round(100_000 / ((rank + 1) * rank))
    est.rank_counts[64] = round(100_000 / 64)
    assert abs(est.r - r_true) < 0.15


def test_branch_mask_matches_the_design_example():
    # K=2, fan-out [2,1,1]: branches fork at j = 0,0,1,2; each sees glue 0..j (paged layout: glue holds the bonus)
    mask = branch_mask(prefix=3, glue=3, glue_visible=[1, 1, 2, 3], depth=0)
    expected_tail = torch.tensor([
        [1, 0, 0, 1, 0, 0, 0],
        [1, 0, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 0, 1],
    ], dtype=torch.bool)
    assert mask.shape == (4, 3 + 3 + 4)
    assert mask[:, :3].all()
    assert torch.equal(mask[:, 3:], expected_tail)
    deeper = branch_mask(prefix=3, glue=3, glue_visible=[1, 1, 2, 3], depth=2)
    assert deeper.shape == (4, 3 + 3 + 3 * 4)
    for d in range(3):  # one identity block per depth
        assert torch.equal(deeper[:, 6 + 4 * d : 10 + 4 * d], torch.eye(4, dtype=torch.bool))


def test_saguaro_scales_the_top_tokens_and_renormalizes():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1]])
    scaled = saguaro_scale(probs, top=2, c=0.5)
    assert torch.allclose(scaled.sum(-1), torch.ones(1))
    assert torch.allclose(scaled, torch.tensor([[0.25, 0.15, 0.1, 0.1]]) / 0.6)
    assert saguaro_scale(probs, top=2, c=1.0) is probs


def test_spare_fan_out_goes_where_it_adds_the_most_hit_probability():
    from ssd.speculation.fanout import spend_spare

    def hit(f: int) -> float:
        return 1 - (f + 1) ** -0.6 if f > 0 else 0.0

    # enough candidates everywhere: the shape as it is
    assert spend_spare((3, 2, 1), [16, 16, 16], [0.4, 0.3, 0.3], hit) == [3, 2, 1]
    # j = 0 is forced (no candidate): its 3 guesses go to j = 1 and 2, within what they have
    counts = spend_spare((3, 2, 1), [0, 16, 2], [0.4, 0.3, 0.3], hit)
    assert counts[0] == 0 and sum(counts) == 6 and counts[2] <= 2 and counts[1] >= 2
    # the likelier stop gets the first spare guess
    assert spend_spare((1, 1, 1), [0, 16, 16], [0.2, 0.7, 0.1], hit) == [0, 2, 1]
    # nowhere to put them: fewer guesses than the budget
    assert spend_spare((3, 2), [1, 1], [0.5, 0.5], hit) == [1, 1]
