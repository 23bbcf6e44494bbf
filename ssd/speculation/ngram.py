"""N-gram prompt lookup: propose the continuation of the latest earlier occurrence of the context tail.

No model and no q: proposals are verified as one-hot. As a tree, each distinct continuation of
the tail (most recent first) becomes a branch from the root.
"""

import torch

from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.speculation import Speculation


class NgramProposer:
    feature_layers: tuple[int, ...] = ()
    feeds_in_background = False  # no state to bring up
    catching_up = False  # nothing runs behind the caller's back

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def continuations(self, tokens: list[int], length: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations (each <= `length` tokens) after a match of the tail."""
        found: list[list[int]] = []
        data = torch.tensor(tokens)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(tokens) <= n:
                continue
            windows = data.unfold(0, n, 1)[:-1]  # [len - n, n]: every earlier n-gram
            hits = (windows == data[-n:]).all(dim=1).nonzero().flatten().tolist()
            for start in reversed(hits):  # most recent first
                cont = tokens[start + n : start + n + length]
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) == limit:
                        return found
            if found:
                return found
        return found

    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]:
        out = []
        for r in requests:
            if r.tree is None:
                conts = self.continuations(r.token_ids, r.num_tokens, 1)
                out.append(Speculation(conts[0] if conts else []))
                continue
            depth = min(r.num_tokens, r.tree.depth)
            tokens: list[int] = []
            parents: list[int] = []
            for cont in self.continuations(r.token_ids, depth, r.tree.top_k):
                cont = cont[: r.tree.budget - len(tokens)]
                for j, t in enumerate(cont):
                    parents.append(0 if j == 0 else len(tokens))
                    tokens.append(t)
            out.append(Speculation(tokens, parents))
        return out

    def catch_up(self, requests: list[ProposeRequest]) -> None:
        pass  # it reads the committed tokens at each propose: no state to bring up

    def observe(self, seq_id: int, outcome: RoundOutcome) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass
