"""SSD glue and branch decoding for an EAGLE-3 head over its dense per-sequence KV.

The glue first catches the head up on positions whose real target features arrived, then runs the
speculation [s_1..s_m] self-conditioned (each step reads the head's own out_hidden of the step before,
as when drafting). Head-cache layout after the glue: L real positions, m glue positions, then branch r of
depth d at L + m + d*M + r. A branch forked at acceptance length j replaces s_{j+1}: depth 0 reads
(guess, out_hidden after j glue steps) at RoPE position L + j and sees the first j glue positions.
Everything past the real positions is scratch: the next catch-up truncates it.
Hidden states and KV stay on the head's device; the logits handed to SSD's token logic are on CPU.
"""

import torch

from ssd.speculation.branch_drafter import BranchRequest, GlueRequest, PickFn
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.tree_mask import branch_mask


class Eagle3BranchDrafter:
    def __init__(self, proposer: Eagle3Proposer) -> None:
        self.proposer = proposer
        self.glue_hidden: dict[int, tuple[int, torch.Tensor]] = {}  # seq id -> (L, [m+1, d] out_hidden per glue row)

    def release(self, seq_id: int) -> None:
        """Forget the sequence's glue hidden states (its head KV is the proposer's to free)."""
        self.glue_hidden.pop(seq_id, None)

    def _to_target(self, logits: torch.Tensor) -> torch.Tensor:  # [n, Vd] -> CPU [n, V] float32, -inf outside
        return self.proposer.head.to_target_vocab(logits.cpu(), float("-inf"))  # moves Vd columns, not V

    @torch.inference_mode()
    def glue(self, requests: list[GlueRequest]) -> list[torch.Tensor]:
        """Catch-up per sequence, then the speculation's self-conditioned steps, one forward per step for all."""
        head, caches, reals, hiddens, rows = self.proposer.head, [], [], [], []
        for r in requests:
            req = ProposeRequest(r.seq_id, r.token_ids, 0, 0.0, torch.Generator(), None, r.features, r.features_start)
            state, hidden, _ = self.proposer._catch_up(req)
            caches.append(state.cache)
            reals.append(state.cache.length)  # L: positions with real target features
            hiddens.append([hidden])  # per sequence: out_hidden after 0..m glue steps, each [d]
            rows.append([state.rows[-1][1]])  # per sequence: draft logits after 0..m glue steps, each [Vd]
        for step in range(max((len(r.speculation) for r in requests), default=0)):
            active = [i for i, r in enumerate(requests) if step < len(r.speculation)]
            outs, logits = head.decode_step([requests[i].speculation[step] for i in active],
                                            [hiddens[i][-1] for i in active], [caches[i] for i in active])
            for i, out, row in zip(active, outs, logits, strict=True):
                hiddens[i].append(out)
                rows[i].append(row)
        for r, real, h in zip(requests, reals, hiddens, strict=True):
            self.glue_hidden[r.seq_id] = (real, torch.stack(h))  # (L, [m+1, d])
        return [self._to_target(torch.stack(r)) for r in rows]

    @torch.inference_mode()
    def decode_branches(self, requests: list[BranchRequest], depth: int, pick: PickFn) -> list[torch.Tensor]:
        """All branches of all sequences, one head forward per depth (attention per sequence, tree-masked)."""
        head, caches, reals, glues, forks, hidden, tokens = self.proposer.head, [], [], [], [], [], []
        for r in requests:
            cache = self.proposer.seqs[r.seq_id].cache
            real, glue_hidden = self.glue_hidden[r.seq_id]
            cache.truncate(real + r.glue_len - 1)  # keep the glue positions s_1..s_m
            caches.append(cache)
            reals.append(real)
            glues.append(r.glue_len - 1)
            forks.append(torch.tensor(r.fork_points))  # [M]
            hidden.append(glue_hidden[forks[-1].to(glue_hidden.device)])  # [M, d]
            tokens.append(torch.tensor(r.tokens))  # [M]
        steps: list[list[torch.Tensor]] = [[] for _ in requests]
        for d in range(depth):
            masks = [branch_mask(reals[i], glues[i], r.fork_points, d) for i, r in enumerate(requests)]
            positions = [reals[i] + forks[i] + d for i in range(len(requests))]  # [M] each
            hidden, logits = head.forward_many(tokens, hidden, positions, masks, caches)
            tokens = [torch.tensor(pick(i, d, self._to_target(row))) for i, row in enumerate(logits)]
            for i, t in enumerate(tokens):
                steps[i].append(t)
        return [torch.stack(s, dim=1) for s in steps]  # [M, depth] each
