"""The verification function alone: greedy paths, exact rejection sampling, one-hot proposals."""

import pytest
import torch

from ssd.speculation.speculation import Speculation
from ssd.speculation.verification import verify_greedy, verify_sampled


def test_greedy_chain_accepts_matching_prefix_then_bonus():
    spec = Speculation([4, 5, 6])
    assert verify_greedy(spec, [4, 5, 9, 1]).tokens == [4, 5, 9]  # s3 rejected: bonus is the argmax there
    assert verify_greedy(spec, [4, 5, 6, 7]).tokens == [4, 5, 6, 7]  # all accepted: bonus from the last position
    assert verify_greedy(spec, [1, 5, 6, 7]).tokens == [1]


def test_greedy_tree_follows_the_argmax_path():
    # root -> {1: 4, 2: 8}; node 2 -> {3: 5}; node 1 -> {4: 9}
    spec = Speculation([4, 8, 5, 9], parents=[0, 0, 2, 1])
    out = verify_greedy(spec, [8, 0, 5, 3, 0])  # argmax at root=8 (node 2), at node 2 = 5 (node 3), at node 3 = 3
    assert out.accepted_nodes == [2, 3]
    assert out.tokens == [8, 5, 3]


def _empirical(make_spec, p, n=20_000):
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(p.shape[-1])
    for _ in range(n):
        counts[verify_sampled(make_spec(g), p, g).tokens[0]] += 1
    return counts / n


P = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]])


def test_draft_sampled_from_q_gives_p():
    q = torch.tensor([[0.1, 0.8, 0.1, 0.0]])
    freq = _empirical(lambda g: Speculation([int(torch.multinomial(q[0], 1, generator=g))], q=q), P)
    assert torch.allclose(freq, P[0], atol=0.015)


@pytest.mark.parametrize("token", [0, 1, 3])
def test_any_fixed_one_hot_proposal_gives_p(token):
    assert torch.allclose(_empirical(lambda g: Speculation([token]), P), P[0], atol=0.015)


def test_one_hot_siblings_keep_p():
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25] * 4, [0.25] * 4])
    spec = Speculation([0, 1], parents=[0, 0])  # two candidate first tokens
    assert torch.allclose(_empirical(lambda g: spec, p), p[0], atol=0.015)


def test_residual_never_samples_the_rejected_token_when_q_covers_it():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0]])
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        out = verify_sampled(Speculation([1], q=q), p, g)
        if out.num_accepted == 0:
            assert out.tokens == [0]
