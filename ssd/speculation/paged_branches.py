"""SSD glue and branch decoding for a draft model over its own paged KV (one batched forward per step).

Physical layout of a sequence with P committed tokens before the bonus: 0..P-1 committed, P..P+m the
glue [bonus, s_1..s_m], then branch r of depth d at P+m+1 + d*M + r. RoPE positions are logical: a branch
forked at acceptance length j sits at P + j + 1 + d. Branch KV is scratch, overwritten by later rounds.
Logits come out in the draft's own vocabulary (`vocab`: trimmed when its LM head is); tokens in are target ids.
"""

import torch

from ssd.context import ForwardMode
from ssd.runtime.model_runner import ForwardItem
from ssd.speculation.branch_drafter import BranchRequest, GlueRequest, PickFn
from ssd.speculation.draft_model import DraftModelProposer, _DraftSeq
from ssd.speculation.tree_mask import branch_mask


class PagedBranchDrafter:
    def __init__(self, proposer: DraftModelProposer) -> None:
        self.proposer = proposer
        self.vocab = proposer.vocab  # the draft's logits: trimmed when its LM head is (tokens stay target ids)

    def release(self, seq_id: int) -> None:
        pass  # no state of its own: the sequence's KV is the proposer's (DraftModelProposer.release frees it)

    def glue(self, requests: list[GlueRequest]) -> list[torch.Tensor]:
        items = []
        for r in requests:
            state = self.proposer.seqs.setdefault(r.seq_id, _DraftSeq())
            bonus_pos = len(r.token_ids) - 1
            start = min(state.num_cached_tokens, bonus_pos)  # `observe` rolled the KV back to what is right
            tokens = r.token_ids[start:] + r.speculation
            self.proposer.worker.block_manager.ensure_capacity(state, start + len(tokens) + r.reserve)
            items.append(ForwardItem(tokens, start, state.block_table, num_logits=len(r.speculation) + 1))
        logits = self.proposer.worker.runner.forward(items, ForwardMode.VERIFY).logits  # [sum(m+1), Vd]
        out, offset = [], 0
        for r in requests:
            n = len(r.speculation) + 1
            state = self.proposer.seqs[r.seq_id]
            state.num_cached_tokens = len(r.token_ids) + len(r.speculation)  # committed + the speculation
            state.token_ids = r.token_ids
            out.append(logits[offset : offset + n].float().cpu())
            offset += n
        return out

    def decode_branches(self, requests: list[BranchRequest], depth: int, pick: PickFn) -> list[torch.Tensor]:
        current = [list(r.tokens) for r in requests]
        result: list[list[list[int]]] = [[] for _ in requests]  # [request][depth][branch]
        for d in range(depth):
            items = []
            for r, toks in zip(requests, current, strict=True):
                m, bonus_pos = len(toks), r.num_committed - 1
                start = bonus_pos + r.glue_len + d * m
                mask = branch_mask(bonus_pos, r.glue_len, [j + 1 for j in r.fork_points], d)  # [M, start + M]
                positions = [bonus_pos + j + 1 + d for j in r.fork_points]
                items.append(ForwardItem(toks, start, self.proposer.seqs[r.seq_id].block_table,
                                         num_logits=m, positions=positions, attn_mask=mask))
            logits = self.proposer.worker.runner.forward(items, ForwardMode.TREE).logits  # [sum M, Vd]
            current = pick(d, list(logits.float().cpu().split([len(t) for t in current])))
            for i, toks in enumerate(current):
                result[i].append(toks)
        return [torch.tensor(steps, dtype=torch.long).T.reshape(len(r.tokens), depth)
                for steps, r in zip(result, requests, strict=True)]
