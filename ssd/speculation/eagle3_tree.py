"""One EAGLE-3 token tree grown depth by depth, so a proposer can expand every frontier node in one head forward.

Selection is EAGLE-2 style: the children tried at a depth are the top-k of every frontier node, and the best
of them by cumulative draft log-probability fill what is left of the node budget. Expanding a depth appends
its nodes' keys to the sequence's head cache after the rows already there (scratch: the next catch-up
truncates them); a node attends to the real positions, its expanded ancestors and itself. Every depth is
expanded whole, so node i (1-based) sits at cache row prefix + i - 1. Under a structured-output grammar only the
children it allows are tried.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ssd.config import TreeShape
from ssd.speculation.speculation import Speculation


@dataclass
class _Node:
    token: int  # target id (-1 at the root)
    parent: int  # index into the node list (-1 for the root)
    score: float  # cumulative draft log-probability
    hidden: torch.Tensor | None = None  # [d] the head's out_hidden at this node, once expanded
    logprobs: torch.Tensor | None = None  # [draft_vocab] next-token log-probs after this node (CPU), once expanded


class TokenTree:
    def __init__(self, shape: TreeShape, depth_limit: int, prefix: int, hidden: torch.Tensor,
                 logprobs: torch.Tensor, allowed: Callable[[list[list[int]]], torch.Tensor] | None = None) -> None:
        """`prefix`: head cache rows of real positions; `hidden` [d] / `logprobs` [Vd]: the head after them;
        `allowed(paths)` [n, Vd] bool: the draft tokens a grammar allows after each path of target ids."""
        self.shape, self.depth_limit, self.prefix = shape, depth_limit, prefix
        self.allowed = allowed
        self.nodes = [_Node(-1, -1, 0.0, hidden, logprobs)]
        self.frontier = [0]
        self.depth = 0

    def grow(self, to_target_ids: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        """Add the next depth's nodes; True when they are to be expanded (another depth may follow).
        `to_target_ids` maps draft ids [n] to target ids [n]."""
        if self.depth >= self.depth_limit or not self.frontier:
            return False
        self.depth += 1
        cand = []  # (score, parent, draft id)
        allowed = self.allowed([self.path(i) for i in self.frontier]) if self.allowed is not None else None
        for row, node_id in enumerate(self.frontier):
            logprobs = self.nodes[node_id].logprobs
            if allowed is not None:
                logprobs = logprobs.masked_fill(~allowed[row], float("-inf"))
            top = torch.topk(logprobs, min(self.shape.top_k, logprobs.numel()))
            score = self.nodes[node_id].score
            cand.extend((score + v, node_id, t) for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                        if v > float("-inf"))
        cand.sort(key=lambda c: -c[0])
        cand = cand[: self.shape.budget - (len(self.nodes) - 1)]
        tokens = to_target_ids(torch.tensor([c[2] for c in cand], dtype=torch.long)).tolist()
        self.frontier = []
        for (score, parent, _), token in zip(cand, tokens, strict=True):
            self.nodes.append(_Node(token, parent, score))
            self.frontier.append(len(self.nodes) - 1)
        return bool(self.frontier) and self.depth < self.depth_limit and len(self.nodes) - 1 < self.shape.budget

    def path(self, node_id: int) -> list[int]:
        """The target ids from the root to the node."""
        path = []
        while node_id > 0:
            path.append(self.nodes[node_id].token)
            node_id = self.nodes[node_id].parent
        return path[::-1]

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The frontier's head inputs: (token ids [n], parent out_hidden [n, d], positions [n],
        mask [n, prefix + nodes] bool, True = may attend)."""
        n = len(self.frontier)
        ancestors = self.speculation().ancestor_mask()[1:, 1:]  # [nodes, nodes]: itself and its ancestors
        frontier_rows = torch.tensor(self.frontier) - 1  # [n]
        mask = torch.cat([torch.ones(n, self.prefix, dtype=torch.bool), ancestors[frontier_rows]], dim=1)
        ids = torch.tensor([self.nodes[i].token for i in self.frontier])
        hidden = torch.stack([self.nodes[self.nodes[i].parent].hidden for i in self.frontier])
        positions = torch.full((n,), self.prefix + self.depth - 1)  # depth 1 follows the last real position
        return ids, hidden, positions, mask

    def expanded(self, hidden: torch.Tensor, logprobs: torch.Tensor) -> None:
        """The frontier's head outputs: out_hidden [n, d], next-token log-probs [n, Vd] (CPU)."""
        for i, node_id in enumerate(self.frontier):
            self.nodes[node_id].hidden, self.nodes[node_id].logprobs = hidden[i], logprobs[i]

    def speculation(self) -> Speculation:
        return Speculation([n.token for n in self.nodes[1:]], [n.parent for n in self.nodes[1:]])
