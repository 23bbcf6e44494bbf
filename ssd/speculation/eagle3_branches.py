"""SSD glue and branch decoding for an EAGLE-3 head over its dense per-sequence KV.

The glue first catches the head up on positions whose real target features arrived (one forward for all
sequences), then runs the speculations [s_1..s_m] self-conditioned (each step reads the head's own out_hidden of
the step before, as when drafting), one forward per step for all sequences. Head-cache layout after the glue:
L real positions, m glue positions, then branch r of depth d at L + m + d*M + r. A branch forked at acceptance
length j replaces s_{j+1}: depth 0 reads (guess, out_hidden after j glue steps) at RoPE position L + j and sees
the first j glue positions. Everything past the real positions is scratch: the next catch-up truncates it.
Hidden states and KV stay on the head's device; the logits handed to SSD's token logic are on CPU, in the
head's trimmed vocabulary (`vocab` maps the chosen tokens to target ids).
"""

import torch

from ssd.speculation.branch_drafter import BranchRequest, GlueRequest, PickFn
from ssd.speculation.draft_vocab import DraftVocab
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.tree_mask import branch_mask


class Eagle3BranchDrafter:
    def __init__(self, proposer: Eagle3Proposer) -> None:
        self.proposer = proposer
        self.vocab = DraftVocab(proposer.head.config.vocab_size, proposer._target_ids)
        self.glue_hidden: dict[int, tuple[int, torch.Tensor]] = {}  # seq id -> (L, [m+1, d]); this build's only

    def release(self, seq_id: int) -> None:
        """Forget the sequence's glue hidden states (its head KV is the proposer's to free)."""
        self.glue_hidden.pop(seq_id, None)

    @torch.inference_mode()
    def glue(self, requests: list[GlueRequest]) -> list[torch.Tensor]:
        """One catch-up forward for all sequences, then the speculations' self-conditioned steps, one forward per
        step for all. A speculation the head has just drafted as a chain (a backup, from the same real positions)
        already ran its first m-1 steps: they are taken from the chain, not run again.
        -> per request [m+1, Vd] float32 draft logits on CPU."""
        head = self.proposer.head
        reused = {i: s for i, r in enumerate(requests)  # features already consumed by the backup that drafted it
                  if r.features is None and (s := self.proposer.drafted_steps(r.seq_id, r.speculation)) is not None}
        fresh = [r for i, r in enumerate(requests) if i not in reused]
        caught_up = iter(self.proposer._catch_up_many([
            ProposeRequest(r.seq_id, r.token_ids, 0, 0.0, torch.Generator(), None, r.features, r.features_start)
            for r in fresh]))
        states = [reused[i] if i in reused else next(caught_up) for i in range(len(requests))]
        # per sequence: out_hidden [d] and draft logits [Vd] after 0..m glue steps (the chain's steps first)
        hiddens = [[s.rows[-1][0], *(out for _, out, _ in s.drafted)] for s in states]
        rows = [[s.rows[-1][1], *(row for _, _, row in s.drafted)] for s in states]
        for s in states:
            s.drafted = []  # their KV is glue KV from here on
        self.glue_hidden = {}  # the previous build's rows are not needed any more
        reals = [s.num_real for s in states]  # L: positions with real target features
        for step in range(max((len(r.speculation) for r in requests), default=0)):
            active = [i for i, r in enumerate(requests) if len(hiddens[i]) - 1 <= step < len(r.speculation)]
            if not active:
                continue
            outs, logits = head.decode_step([requests[i].speculation[step] for i in active],
                                            [hiddens[i][-1] for i in active], [states[i].cache for i in active])
            for i, out, row in zip(active, outs, logits, strict=True):
                hiddens[i].append(out)
                rows[i].append(row)
        for r, real, h in zip(requests, reals, hiddens, strict=True):
            self.glue_hidden[r.seq_id] = (real, torch.stack(h))  # (L, [m+1, d])
        return [torch.stack(r).float().cpu() for r in rows]

    @torch.inference_mode()
    def decode_branches(self, requests: list[BranchRequest], depth: int, pick: PickFn) -> list[torch.Tensor]:
        """All branches of all sequences, one head forward per depth (attention per sequence, tree-masked)."""
        head, caches, reals, glues, forks, hidden, tokens = self.proposer.head, [], [], [], [], [], []
        for r in requests:
            cache = self.proposer.seqs[r.seq_id].cache
            real, glue_hidden = self.glue_hidden.pop(r.seq_id)
            cache.truncate(real + r.glue_len - 1)  # keep the glue positions s_1..s_m
            caches.append(cache)
            reals.append(real)
            glues.append(r.glue_len - 1)
            forks.append(torch.tensor(r.fork_points))  # [M]
            hidden.append(glue_hidden[forks[-1].to(glue_hidden.device)])  # [M, d]
            tokens.append(torch.tensor(r.tokens))  # [M] target ids
        steps: list[list[torch.Tensor]] = [[] for _ in requests]
        for d in range(depth):
            masks = [branch_mask(reals[i], glues[i], r.fork_points, d) for i, r in enumerate(requests)]
            positions = [reals[i] + forks[i] + d for i in range(len(requests))]  # [M] each
            hidden, logits = head.forward_many(tokens, hidden, positions, masks, caches)
            tokens = [torch.tensor(t) for t in pick(d, [row.float().cpu() for row in logits])]  # target ids
            for i, t in enumerate(tokens):
                steps[i].append(t)
        return [torch.stack(s, dim=1) for s in steps]  # [M, depth] each
