"""One target's session on the draft: its sequences' committed tokens, target features and random streams.

Target sequence ids are scoped to the session; the shared proposer sees service-unique ids, so
several targets can use one draft (and one draft KV pool) at once. A proposer that drafts from
target features (EAGLE-3) only sees a sequence whose features cover every committed position
without a gap (e.g. not one re-sent after a reconnect): the others get empty speculations.
"""

import itertools
from dataclasses import dataclass

import structlog
import torch

from protos.ssd.v1 import common_pb2, draft_pb2
from rpc.tensors import SessionTensors
from ssd.spec.proposer import Proposer, ProposeRequest, TreeShape
from ssd.spec.speculation import Speculation

log = structlog.get_logger(__name__)

_internal_ids = itertools.count(1)  # service-wide proposer ids (a plain counter; no import-time work)


@dataclass
class DraftSequence:
    internal_id: int  # the id the proposer knows
    token_ids: list[int]  # committed tokens (prompt + output)
    temperature: float  # draft sampling temperature
    generator: torch.Generator  # the draft's random stream for this sequence
    num_features: int = 0  # positions 0.. whose target features arrived, without a gap
    pending: tuple[int, torch.Tensor] | None = None  # (first position, [n, F]) not yet given to the proposer

    def add_features(self, start: int, features: torch.Tensor) -> None:
        """Queue features of positions start..; a gap after the covered positions is never filled."""
        if start > self.num_features:
            return  # positions num_features..start-1 are missing: the sequence stays undraftable
        if self.pending is not None and self.pending[0] <= start:
            first, old = self.pending
            features, start = torch.cat([old[: start - first], features]), first
        self.pending = (start, features)
        self.num_features = start + len(features)

    @property
    def has_features(self) -> bool:
        """Whether every position but the last (its features come with its verify) has target features."""
        return self.num_features >= max(1, len(self.token_ids) - 1)

    def take_features(self) -> tuple[int, torch.Tensor | None]:
        start, features = self.pending if self.pending is not None else (0, None)
        self.pending = None
        return start, features


def features_from(tensor: common_pb2.Tensor, width: int, tensors: SessionTensors) -> torch.Tensor:
    """[n, width] target features off the wire (float32, or bfloat16 sent as bit patterns)."""
    if tensor.dtype not in ("float32", "bfloat16") or len(tensor.shape) != 2 or tensor.shape[1] != width:
        raise ValueError(f"target features must be [n, {width}] float32 or bfloat16, "
                         f"got {list(tensor.shape)} {tensor.dtype}")
    features = torch.from_numpy(tensors.decode(tensor))
    return features.view(torch.bfloat16) if tensor.dtype == "bfloat16" else features


class Session:
    def __init__(self, proposer: Proposer, target_id: str, feature_width: int = 0) -> None:
        self.proposer = proposer
        self.target_id = target_id
        self.feature_width = feature_width  # F of the features the proposer needs; 0 = it needs none
        self.seqs: dict[int, DraftSequence] = {}  # target seq id -> state
        self.tensors = SessionTensors()  # inline, or shared memory once Hello / Ready agreed on it

    def _features(self, seq: DraftSequence, msg: draft_pb2.Prefill | draft_pb2.Outcome) -> None:
        if self.feature_width and msg.HasField("features"):
            seq.add_features(msg.features_start, features_from(msg.features, self.feature_width, self.tensors))

    def _prefill(self, p: draft_pb2.Prefill) -> DraftSequence:
        old = self.seqs.pop(p.seq_id, None)
        if old is not None:
            self.proposer.release(old.internal_id)
        seq = DraftSequence(next(_internal_ids), list(p.token_ids), p.temperature,
                            torch.Generator().manual_seed(p.seed))
        self._features(seq, p)
        self.seqs[p.seq_id] = seq
        if self.feature_width and not seq.has_features:
            log.info("no target features for the prompt; this sequence gets no speculation",
                     target=self.target_id, seq_id=p.seq_id, num_tokens=len(seq.token_ids),
                     num_features=seq.num_features)
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
        seq.num_features = min(seq.num_features, o.num_committed_before)  # features past it were of dropped tokens
        self._features(seq, o)
        self.proposer.commit(seq.internal_id, len(seq.token_ids))
        return seq

    def _apply(self, round_: draft_pb2.Round, out: draft_pb2.Speculations) -> list[tuple[int, DraftSequence]]:
        """Apply the round's prefills and outcomes; the sequences to propose for (errors go to `out`)."""
        ready: list[tuple[int, DraftSequence]] = []
        for p in round_.prefills:
            if not p.token_ids:
                out.errors.add(seq_id=p.seq_id, code="INVALID_ARGUMENT", message="a Prefill needs its tokens")
                continue
            try:
                ready.append((p.seq_id, self._prefill(p)))
            except ValueError as e:  # malformed features: the sequence is not registered
                out.errors.add(seq_id=p.seq_id, code="INVALID_ARGUMENT", message=str(e))
        for o in round_.outcomes:
            try:
                ready.append((o.seq_id, self._outcome(o)))
            except KeyError as e:
                out.errors.add(seq_id=o.seq_id, code="NOT_FOUND", message=str(e.args[0]))
            except ValueError as e:
                self.release([o.seq_id])  # its tokens or features are no longer known: the target re-sends a Prefill
                out.errors.add(seq_id=o.seq_id, code="INVALID_ARGUMENT", message=str(e))
        return ready

    def run_round(self, round_: draft_pb2.Round) -> draft_pb2.Speculations:
        """Apply prefills and outcomes, propose for every sequence that is valid. Runs in the draft's worker thread."""
        out = draft_pb2.Speculations()
        ready = self._apply(round_, out)
        k = round_.num_speculative_tokens
        if not ready or k < 1:
            return out
        tree = None
        if round_.HasField("tree"):
            tree = TreeShape(budget=round_.tree.budget, depth=round_.tree.depth, top_k=round_.tree.top_k)
        asking = []
        for seq_id, seq in ready:
            if self.feature_width and not seq.has_features:
                out.items.add(seq_id=seq_id)  # empty: the target takes a plain decode step
            else:
                asking.append((seq_id, seq))
        specs = self.proposer.propose([self._request(seq, k, tree) for _, seq in asking]) if asking else []
        self.tensors.start_message(sum(s.q.numel() * 4 for s in specs if s.q is not None))  # q goes as float32
        for (seq_id, _), spec in zip(asking, specs, strict=True):
            out.items.append(to_message(seq_id, spec, self.tensors))
        return out

    def _request(self, seq: DraftSequence, k: int, tree: TreeShape | None) -> ProposeRequest:
        features_start, features = seq.take_features()  # [n, F] or None
        return ProposeRequest(seq.internal_id, list(seq.token_ids), k, seq.temperature, seq.generator, tree,
                              features, features_start)

    def release(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            seq = self.seqs.pop(seq_id, None)
            if seq is not None:
                self.proposer.release(seq.internal_id)

    def close(self) -> None:
        self.release(list(self.seqs))
        self.tensors.close()  # unlinks this session's shared-memory segment, if any


def to_message(seq_id: int, spec: Speculation, tensors: SessionTensors) -> draft_pb2.SequenceSpeculation:
    msg = draft_pb2.SequenceSpeculation(seq_id=seq_id, token_ids=spec.tokens, parents=spec.parents or [])
    if spec.q is not None:  # [n, V] float32
        msg.q.CopyFrom(tensors.encode(spec.q.float().numpy()))
    return msg
