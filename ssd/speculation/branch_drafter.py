"""What SSD needs from a neural draft beyond `propose`: a glue forward and a batched tree decode of branches.

After answering a round, the draft (1) runs the speculation it just returned, [bonus, s_1..s_m], through
its model once (the glue), which leaves its KV consistent with "all accepted" and gives the m+1
next-token distributions; (2) forks bonus guesses at each acceptance length j; (3) decodes every branch
of every sequence K steps deep, one batched forward per depth, under the tree mask of ssd/speculation/tree_mask.py.
A drafter implements (1) and (3) over its own KV; ssd/speculation/ssd_speculator.py does the rest. Logits come
in the drafter's own vocabulary (`vocab`: an EAGLE-3 head's trimmed one), so no branch step widens them to the
target's; tokens in and out are target ids.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ssd.speculation.draft_vocab import DraftVocab


@dataclass(frozen=True)
class GlueRequest:
    seq_id: int
    token_ids: list[int]  # every committed token; the last one (the bonus) has no draft KV yet
    speculation: list[int]  # s_1..s_m: the speculation just returned for this sequence
    reserve: int  # scratch positions to hold after the glue for the tree decode
    features: torch.Tensor | None = None  # [n, F] target features of positions features_start.. (EAGLE-3)
    features_start: int = 0


@dataclass(frozen=True)
class BranchRequest:
    seq_id: int
    num_committed: int  # len(token_ids) of the glue request
    glue_len: int  # m + 1: the glue's length (bonus + speculation)
    fork_points: list[int]  # [M] acceptance length j of each branch
    tokens: list[int]  # [M] each branch's bonus guess (fed at depth 0)


# pick(depth, per request logits [M_i, Vd] float32 in the drafter's vocabulary) -> per request the next target id
# of each of its branches (one call per depth for every sequence, so sampling runs batched)
PickFn = Callable[[int, list[torch.Tensor]], list[list[int]]]


class BranchDrafter(Protocol):
    vocab: DraftVocab  # the vocabulary of the logits it hands out

    def glue(self, requests: list[GlueRequest]) -> list[torch.Tensor]:
        """Per request: [m+1, Vd] float32 next-token logits on CPU, in `vocab`."""
        ...

    def release(self, seq_id: int) -> None:
        """Drop whatever the drafter keeps for the sequence (its proposer's state is released by the proposer)."""
        ...

    def decode_branches(self, requests: list[BranchRequest], depth: int, pick: PickFn) -> list[torch.Tensor]:
        """Per request: [M, depth] int64 branch tokens; call only right after `glue` for the same sequences."""
        ...
