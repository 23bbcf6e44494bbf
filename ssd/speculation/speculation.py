"""What a proposer returns for one sequence and round: a chain or a token tree of draft tokens.

Vocabulary (ARCHITECTURE.md): p is the target's distribution, q the draft's. A chain is a tree
whose every node's parent is the node before it. Node indices count from 1; parent 0 is the
root, i.e. the sequence's last committed token (whose logits the verify forward also computes).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Speculation:
    tokens: list[int]  # draft tokens, nodes 1..n in order; a parent always precedes its children
    parents: list[int] | None = None  # [n]: parent node of each token (0 = root); None = a chain
    # [n, V] float32 on CPU: the distribution each token was sampled from; None = one-hot
    q: torch.Tensor | None = None
    cache_hit: bool | None = None  # SSD: True = from the speculation cache, False = a backup; None = not SSD
    predicted_hit: float | None = None  # SSD: the draft's estimate that verifying this hits its next cache
    num_own: int | None = None  # structured output: leading tokens the proposer drafted (the rest spliced); None = all

    def __post_init__(self) -> None:
        if self.parents is not None and len(self.parents) != len(self.tokens):
            raise ValueError("a token tree needs one parent per token")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("q needs one row per draft token")

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def parent_list(self) -> list[int]:
        return self.parents if self.parents is not None else list(range(len(self.tokens)))

    def depths(self) -> list[int]:
        """Depth of each node (root = 0, so node depth >= 1)."""
        depth = [0]
        for parent in self.parent_list():
            depth.append(depth[parent] + 1)
        return depth[1:]

    def paths(self) -> list[list[int]]:
        """[n+1] over root + nodes: the draft tokens from the root to each node, inclusive (root: [])."""
        paths: list[list[int]] = [[]]
        for i, parent in enumerate(self.parent_list()):
            paths.append(paths[parent] + [self.tokens[i]])
        return paths

    def ancestor_mask(self) -> torch.Tensor:
        """[n+1, n+1] bool over root + nodes: row i may attend to column j (j is i or an ancestor of i)."""
        parents = self.parent_list()
        n = len(parents) + 1
        mask = torch.eye(n, dtype=torch.bool)
        mask[:, 0] = True
        for i, parent in enumerate(parents, start=1):
            mask[i] |= mask[parent]
        return mask


@dataclass(frozen=True)
class Outcome:
    """The verification result of one sequence and round: k accepted draft tokens, then the bonus token."""

    accepted_nodes: list[int]  # node indices (1-based) of the accepted path, root excluded; len = k
    tokens: list[int]  # the k accepted tokens followed by the bonus token (k + 1 tokens)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)

    @property
    def bonus_token(self) -> int:
        return self.tokens[-1]
