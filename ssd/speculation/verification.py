"""Exact verification of a speculation against the target distribution p.

Greedy: follow the draft while each token is the argmax of p at its parent; the bonus token is
the argmax where the draft stops. Sampling (SSD.md §1): a token drawn from a known q is accepted
with probability min(1, p(x)/q(x)); on rejection the bonus token is drawn from
normalize(max(0, p - q)). A token with no q (n-gram, random, cached or tree candidates) is a
one-hot proposal: accepted with probability p(x); on rejection x is removed from p, which is
renormalized. Siblings in a tree are tried in order with the same rule (recursive rejection),
so the output is distributed exactly as p in every case.
"""

import torch

from ssd.sampling.sampler import sample_from
from ssd.speculation.speculation import Outcome, Speculation


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:  # [V] -> token
    return int(sample_from(probs[None], generator)[0])


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator))


def _children(spec: Speculation) -> list[list[int]]:
    """children[i] = node indices whose parent is node i (i = 0 is the root), in proposal order."""
    children: list[list[int]] = [[] for _ in range(spec.num_tokens + 1)]
    for node, parent in enumerate(spec.parent_list(), start=1):
        children[parent].append(node)
    return children


def verify_greedy(spec: Speculation, target_argmax: list[int]) -> Outcome:
    """target_argmax[i] = argmax of the target's logits at node i (0 = root)."""
    children = _children(spec)
    node, path = 0, []
    while True:
        wanted = target_argmax[node]
        nxt = next((c for c in children[node] if spec.tokens[c - 1] == wanted), None)
        if nxt is None:
            return Outcome(path, [spec.tokens[c - 1] for c in path] + [wanted])
        path.append(nxt)
        node = nxt


def verify_sampled(spec: Speculation, p: torch.Tensor, generator: torch.Generator) -> Outcome:
    """p: [n+1, V] float32 target probabilities at the root and at each node."""
    children = _children(spec)
    node, path = 0, []
    while True:
        residual = p[node].clone()  # [V]
        accepted = None
        for child in children[node]:
            token = spec.tokens[child - 1]
            q_row = spec.q[child - 1] if spec.q is not None and not spec.is_tree else None
            if q_row is None:  # one-hot proposal
                total = float(residual.sum())
                if total > 0 and _uniform(generator) < float(residual[token]) / total:
                    accepted = child
                    break
                residual[token] = 0.0
            else:
                if _uniform(generator) < min(1.0, float(residual[token]) / max(float(q_row[token]), 1e-30)):
                    accepted = child
                    break
                residual = torch.clamp(residual - q_row, min=0.0)
        if accepted is None:
            if float(residual.sum()) <= 0:  # p == q up to rounding: any residual is p itself
                residual = p[node]
            bonus = _draw(residual / residual.sum(), generator)
            return Outcome(path, [spec.tokens[c - 1] for c in path] + [bonus])
        path.append(accepted)
        node = accepted
