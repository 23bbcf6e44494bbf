"""SSD glue and branch decoding for an EAGLE-3 head over its dense per-sequence KV.

The glue first catches the head up on positions whose real target features arrived, then runs the
speculation [s_1..s_m] self-conditioned (each step reads the head's own out_hidden of the step before,
as when drafting). Head-cache layout after the glue: L real positions, m glue positions, then branch r of
depth d at L + m + d*M + r. A branch forked at acceptance length j replaces s_{j+1}: depth 0 reads
(guess, out_hidden after j glue steps) at RoPE position L + j and sees the first j glue positions.
Everything past the real positions is scratch: the next catch-up truncates it.
"""

import torch

from ssd.spec.branch_drafter import BranchRequest, GlueRequest, PickFn
from ssd.spec.eagle3_proposer import Eagle3Proposer
from ssd.spec.proposer import ProposeRequest
from ssd.spec.tree_mask import branch_mask


class Eagle3BranchDrafter:
    def __init__(self, proposer: Eagle3Proposer) -> None:
        self.proposer = proposer
        self.glue_hidden: dict[int, tuple[int, torch.Tensor]] = {}  # seq id -> (L, [m+1, d] out_hidden per glue row)
        head = proposer.head
        self._target_ids = head.to_target_ids(torch.arange(head.config.draft_vocab_size))  # [Vd]

    def _to_target(self, logits: torch.Tensor) -> torch.Tensor:  # [n, Vd] -> [n, V] float32, -inf outside
        full = torch.full((logits.shape[0], self.proposer.head.config.vocab_size), float("-inf"))
        full[:, self._target_ids] = logits.float()
        return full

    @torch.inference_mode()
    def glue(self, requests: list[GlueRequest]) -> list[torch.Tensor]:
        head, out = self.proposer.head, []
        for r in requests:
            req = ProposeRequest(r.seq_id, r.token_ids, 0, 0.0, torch.Generator(), None, r.features, r.features_start)
            state, hidden, _ = self.proposer._catch_up(req)
            real = state.cache.length
            hiddens, rows = [hidden], [state.rows[-1][1]]
            for token in r.speculation:
                h, logits = head(torch.tensor([token]), hiddens[-1][None], state.cache)
                hiddens.append(h[-1])
                rows.append(logits[-1])
            self.glue_hidden[r.seq_id] = (real, torch.stack(hiddens))
            out.append(self._to_target(torch.stack(rows)))
        return out

    @torch.inference_mode()
    def decode_branches(self, requests: list[BranchRequest], depth: int, pick: PickFn) -> list[torch.Tensor]:
        head, result = self.proposer.head, []
        for i, r in enumerate(requests):
            cache = self.proposer.seqs[r.seq_id].cache
            real, glue_hidden = self.glue_hidden[r.seq_id]
            glue = r.glue_len - 1  # head glue positions: s_1..s_m
            cache.truncate(real + glue)
            js = torch.tensor(r.fork_points)
            hidden = glue_hidden[js]  # [M, d]
            tokens = torch.tensor(r.tokens)
            steps = []
            for d in range(depth):
                mask = branch_mask(real, glue, r.fork_points, d)  # [M, real + glue + (d+1)*M]
                hidden, logits = head.forward_masked(tokens, hidden, real + js + d, mask, cache)
                tokens = torch.tensor(pick(i, d, self._to_target(logits)))
                steps.append(tokens)
            result.append(torch.stack(steps, dim=1))  # [M, depth]
        return result
