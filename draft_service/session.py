"""One target's session on the draft: its sequences' committed tokens and random streams.

Target sequence ids are scoped to the session; the shared proposer sees service-unique ids, so
several targets can use one draft (and one draft KV pool) at once.
"""

import itertools
from dataclasses import dataclass

import torch

from protos.ssd.v1 import draft_pb2
from rpc.tensors import to_tensor
from ssd.spec.proposer import Proposer, ProposeRequest, TreeShape
from ssd.spec.speculation import Speculation

_internal_ids = itertools.count(1)  # service-wide proposer ids (a plain counter; no import-time work)


@dataclass
class DraftSequence:
    internal_id: int  # the id the proposer knows
    token_ids: list[int]  # committed tokens (prompt + output)
    temperature: float  # draft sampling temperature
    generator: torch.Generator  # the draft's random stream for this sequence


class Session:
    def __init__(self, proposer: Proposer, target_id: str) -> None:
        self.proposer = proposer
        self.target_id = target_id
        self.seqs: dict[int, DraftSequence] = {}  # target seq id -> state

    def _prefill(self, p: draft_pb2.Prefill) -> DraftSequence:
        old = self.seqs.pop(p.seq_id, None)
        if old is not None:
            self.proposer.release(old.internal_id)
        seq = DraftSequence(next(_internal_ids), list(p.token_ids), p.temperature,
                            torch.Generator().manual_seed(p.seed))
        self.seqs[p.seq_id] = seq
        return seq

    def _outcome(self, o: draft_pb2.Outcome) -> DraftSequence:
        seq = self.seqs.get(o.seq_id)
        if seq is None:
            raise KeyError(f"unknown sequence id {o.seq_id} on this session; send a Prefill first")
        if not 0 <= o.num_committed_before <= len(seq.token_ids):
            raise ValueError(f"sequence {o.seq_id}: num_committed_before {o.num_committed_before} "
                             f"is past the {len(seq.token_ids)} tokens the draft holds")
        del seq.token_ids[o.num_committed_before :]
        seq.token_ids.extend(o.new_token_ids)
        self.proposer.commit(seq.internal_id, len(seq.token_ids))
        return seq

    def run_round(self, round_: draft_pb2.Round) -> draft_pb2.Speculations:
        """Apply prefills and outcomes, propose for every sequence that is valid. Runs in the draft's worker thread."""
        out = draft_pb2.Speculations()
        ready: list[tuple[int, DraftSequence]] = []
        for p in round_.prefills:
            if not p.token_ids:
                out.errors.add(seq_id=p.seq_id, code="INVALID_ARGUMENT", message="a Prefill needs its tokens")
                continue
            ready.append((p.seq_id, self._prefill(p)))
        for o in round_.outcomes:
            try:
                ready.append((o.seq_id, self._outcome(o)))
            except KeyError as e:
                out.errors.add(seq_id=o.seq_id, code="NOT_FOUND", message=str(e.args[0]))
            except ValueError as e:
                out.errors.add(seq_id=o.seq_id, code="INVALID_ARGUMENT", message=str(e))
        k = round_.num_speculative_tokens
        if not ready or k < 1:
            return out
        tree = None
        if round_.HasField("tree"):
            tree = TreeShape(budget=round_.tree.budget, depth=round_.tree.depth, top_k=round_.tree.top_k)
        requests = [ProposeRequest(s.internal_id, list(s.token_ids), k, s.temperature, s.generator, tree)
                    for _, s in ready]
        for (seq_id, _), spec in zip(ready, self.proposer.propose(requests), strict=True):
            out.items.append(to_message(seq_id, spec))
        return out

    def release(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            seq = self.seqs.pop(seq_id, None)
            if seq is not None:
                self.proposer.release(seq.internal_id)

    def close(self) -> None:
        self.release(list(self.seqs))


def to_message(seq_id: int, spec: Speculation) -> draft_pb2.SequenceSpeculation:
    msg = draft_pb2.SequenceSpeculation(seq_id=seq_id, token_ids=spec.tokens, parents=spec.parents or [])
    if spec.q is not None:  # [n, V] float32
        msg.q.CopyFrom(to_tensor(spec.q.float().numpy()))
    return msg
