"""Simulated greedy token-tree speculation: a best-first tree (EAGLE-2 style) of `budget` draft tokens, each
expanded node proposing its top-`branching` children ranked by cumulative draft log-probability; the target
accepts the longest root path matching its greedy tokens.
"""

import heapq
import itertools
from dataclasses import dataclass

import torch

from draft_training.chain_sim import ChainStats, TraceLike, catch_up
from ssd.models.eagle3 import Eagle3Head, HeadKVCache


@dataclass
class _Node:
    token: int  # target id
    depth: int  # 1 = a child of the root
    parent: int  # index into the node list; -1 = the root
    k: torch.Tensor | None = None  # [1, KVH, D] this node's key in the head cache, once expanded
    v: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # [1, d] out_hidden, once expanded


def _ancestors(nodes: list[_Node], index: int) -> list[_Node]:
    path = []
    while index >= 0:
        path.append(nodes[index])
        index = nodes[index].parent
    return path[::-1]


def _expand(head: Eagle3Head, nodes: list[_Node], index: int, cache: HeadKVCache, n: int,
            root_hidden: torch.Tensor) -> torch.Tensor:
    """Run the head on node `index` (cache: true prefix + its ancestors); returns its logits [Vd]."""
    node = nodes[index]
    cache.truncate(n)
    for a in _ancestors(nodes, node.parent):
        cache.append(a.k, a.v)
    parent_hidden = root_hidden if node.parent < 0 else nodes[node.parent].hidden
    node.hidden, logits = head(torch.tensor([node.token]), parent_hidden, cache)
    node.k, node.v = cache.k[cache.length - 1 : cache.length].clone(), cache.v[cache.length - 1 : cache.length].clone()
    return logits[0]


class _Frontier:
    """Candidate nodes ranked by cumulative draft log-probability (best first)."""

    def __init__(self, head: Eagle3Head, branching: int) -> None:
        self.head, self.branching = head, branching
        self.heap: list[tuple[float, int, int, int, int]] = []  # (-score, tie, parent, token, depth)
        self.order = itertools.count()

    def push(self, logits: torch.Tensor, parent: int, score: float, depth: int) -> None:
        logp, ids = torch.log_softmax(logits, dim=-1).topk(self.branching)
        for lp, token in zip(logp.tolist(), self.head.to_target_ids(ids).tolist(), strict=True):
            heapq.heappush(self.heap, (-(score + lp), next(self.order), parent, token, depth))

    def pop(self) -> tuple[float, int, int, int]:  # (score, parent, token, depth)
        neg, _, parent, token, depth = heapq.heappop(self.heap)
        return -neg, parent, token, depth


def _build_tree(head: Eagle3Head, cache: HeadKVCache, n: int, root_hidden: torch.Tensor, root_logits: torch.Tensor,
                budget: int, branching: int, max_depth: int) -> list[_Node]:
    frontier = _Frontier(head, branching)
    frontier.push(root_logits, -1, 0.0, 1)
    nodes: list[_Node] = []
    while frontier.heap and len(nodes) < budget:
        score, parent, token, depth = frontier.pop()
        nodes.append(_Node(token, depth, parent))
        if depth < max_depth and len(nodes) < budget:
            logits = _expand(head, nodes, len(nodes) - 1, cache, n, root_hidden)
            frontier.push(logits, len(nodes) - 1, score, depth + 1)
    return nodes


def simulate_tree(head: Eagle3Head, trace: TraceLike, budget: int, branching: int, max_depth: int,
                  stats: ChainStats) -> None:
    tokens, total = trace.tokens, len(trace.tokens)
    fused = head.fuse(trace.features.to(head.fc.weight.dtype))
    cache = head.new_cache(total + max_depth + 1)
    n = trace.prompt_len
    while n < total - 1:
        root_hidden, root_logits = catch_up(head, tokens, fused, cache, n)
        nodes = _build_tree(head, cache, n, root_hidden, root_logits, budget, branching, max_depth)
        accepted, current = 0, -1
        while n + accepted + 1 < total:
            want = int(tokens[n + accepted + 1])
            match = [i for i, nd in enumerate(nodes) if nd.parent == current and nd.token == want]
            if not match:
                break
            current, accepted = match[0], accepted + 1
        cache.truncate(n)
        stats.add(accepted, min(max_depth, total - 1 - n))
        n += accepted + 1
