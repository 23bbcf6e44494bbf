"""One target's session on the draft: one DraftRecord per sequence (ssd/speculation/draft_record.py).

Target sequence ids are scoped to the session; the shared proposer sees service-unique ids, so
several targets can use one draft (and one draft KV pool) at once. A proposer that drafts from
target features (EAGLE-3) only sees a sequence whose features cover every committed position
without a gap (e.g. not one re-sent after a reconnect): the others get empty speculations. A Prefill whose
prompt the target's prefix cache served in part (`num_cached_tokens`) starts from the draft's own prefix cache
(draft_service/draft_prefix.py); a draft without those blocks refuses it with FAILED_PRECONDITION.

SSD: a sequence whose Prefill's mode is SSD (on a neural draft) is answered by the SsdSpeculator
from its speculation cache, under the session's SSD settings (Hello.ssd over the draft's); `answer` returns
the cache build to run after the answer is sent (`build`, queued by the servicer). Other sequences, and every one
on an n-gram draft, get plain SD.

Mode auto's plain steps: a `catch_up` message's prefills and outcomes are applied as a round's, then the proposer
runs over the committed tokens (`catch_up`); nothing is answered.
"""

import itertools
import time
from dataclasses import dataclass

import structlog
import torch

from draft_service.draft_prefix import restore_prefix
from draft_service.limits import (
    SessionLimits,
    check_feature_rows,
    check_feature_tensor,
    check_prefill_fields,
    check_round,
    check_tokens,
)
from draft_service.ssd_options import options_config, prefill_mode, timings
from protos.ssd.v1 import common_pb2, draft_pb2
from rpc.tensors import SessionTensors
from ssd.config import DecodeMode, SsdConfig, TreeShape
from ssd.errors import (
    InvalidRequestError,
    PrefixUnavailableError,
    ResourceExhaustedError,
    UnknownSequenceError,
)
from ssd.sampling.grammar import Grammar, GrammarCompiler, GrammarState
from ssd.speculation.draft_record import DraftRecord
from ssd.speculation.proposer import Proposer, ProposeRequest
from ssd.speculation.round_outcome import NO_SPECULATION, RoundOutcome
from ssd.speculation.speculation import Speculation
from ssd.speculation.ssd_speculator import BuildJob, SsdSpeculator
from tensor_transport import torch_tensors

log = structlog.get_logger(__name__)

_internal_ids = itertools.count(1)  # service-wide proposer ids (a plain counter; no import-time work)


def features_from(tensor: common_pb2.Tensor, width: int, tensors: SessionTensors,
                  device: torch.device) -> torch.Tensor:
    """[n, width] target features off the wire (float32 or bfloat16; inline, shared memory or CUDA IPC),
    on the draft's `device`. A malformed tensor (shape, dtype, byte count, handle) is InvalidRequestError."""
    check_feature_tensor(tensor, width)
    try:
        return torch_tensors.decode(tensors, tensor, device)
    except (ValueError, OSError) as e:  # a handle that does not open or points past its segment
        raise InvalidRequestError(f"target features cannot be read: {e}") from e


@dataclass
class RoundResult:
    speculations: draft_pb2.Speculations  # the answer, to send at once
    build: BuildJob | None = None  # SSD: the cache build to run after the answer is sent (`Session.build`)


class Session:
    """`ssd` wraps `proposer` (the same neural draft) for SSD sequences; None = the draft serves plain SD only."""

    def __init__(self, proposer: Proposer, target_id: str, feature_width: int = 0,
                 ssd: SsdSpeculator | None = None, device: torch.device | None = None,
                 grammars: GrammarCompiler | None = None, vocab_size: int = 0,
                 limits: SessionLimits | None = None) -> None:
        self.proposer = proposer
        self.vocab_size = vocab_size  # token ids must be below it; 0 = any id >= 0 (n-gram, until Hello names one)
        self.limits = limits or SessionLimits()
        self.grammars = grammars  # None: grammars in Prefills are ignored (drafts propose unconstrained)
        self.ssd = ssd
        self.ssd_config = ssd.config if ssd is not None else SsdConfig()  # Hello.ssd over the draft's defaults
        self.target_id = target_id
        self.feature_width = feature_width  # F of the features the proposer needs; 0 = it needs none
        self.seqs: dict[int, DraftRecord] = {}  # target seq id -> its record
        self.device = device or torch.device("cpu")  # where the draft's model lives
        self.tensors = torch_tensors.session_tensors(self.device)  # inline until Hello / Ready agree on more
        self.last_build_s = 0.0  # this session's previous SSD cache build
        self.last_build_budget = 0  # the fan-out budget it prepared (another session's build may have run since)
        self._said_no_ssd = False  # an ssd Prefill on a draft without SSD is logged once per session
        self._said_grammar = False  # the first sequence drafted under its grammar is logged once per session

    def set_ssd_options(self, options: draft_pb2.SsdOptions) -> None:
        """Hello.ssd: this session's SSD settings over the draft's; InvalidRequestError for a bad value."""
        self.ssd_config = options_config(self.ssd_config, options)

    def _features(self, seq: DraftRecord, msg: draft_pb2.Prefill | draft_pb2.Outcome) -> None:
        if self.feature_width and msg.HasField("features"):
            features = features_from(msg.features, self.feature_width, self.tensors, self.device)  # [n, F]
            check_feature_rows(len(features), msg.features_start, len(seq.token_ids))
            seq.features.add(msg.features_start, features)

    def _prefill(self, p: draft_pb2.Prefill) -> DraftRecord:
        """A new sequence; InvalidRequestError / ResourceExhaustedError refuse it (nothing is registered)."""
        check_prefill_fields(p.token_ids, p.temperature, self.vocab_size, self.limits)
        if p.seq_id not in self.seqs and len(self.seqs) >= self.limits.max_sequences:
            raise ResourceExhaustedError(f"this session already holds {len(self.seqs)} sequences, its limit")
        self.release([p.seq_id])
        mode = prefill_mode(p)
        seq = DraftRecord(next(_internal_ids), list(p.token_ids), p.temperature,
                          torch.Generator().manual_seed(p.seed), mode=mode if self.ssd is not None else DecodeMode.SD)
        if mode is DecodeMode.SSD and self.ssd is None and not self._said_no_ssd:
            self._said_no_ssd = True
            log.info("SSD asked of a draft without a speculation cache (n-gram); serving plain SD",
                     target=self.target_id, seq_id=p.seq_id)
        if self.feature_width and p.num_cached_tokens:
            seq.features.end = restore_prefix(self.proposer, seq.seq_id, p)  # the head holds positions 0..N-2
        self._features(seq, p)
        if p.HasField("grammar"):
            seq.grammar, seq.answer_start = self._grammar(p), p.answer_start
        self.seqs[p.seq_id] = seq
        if self.feature_width and not seq.has_features:
            log.info("no target features for the prompt; this sequence gets no speculation",
                     target=self.target_id, seq_id=p.seq_id, num_tokens=len(seq.token_ids),
                     num_features=seq.features.end)
        return seq

    def _grammar(self, p: draft_pb2.Prefill) -> GrammarState | None:
        """The Prefill's grammar compiled here; None when this draft cannot (it then drafts without it: the
        target enforces the grammar either way)."""
        kind = p.grammar.WhichOneof("kind")
        if self.grammars is None or kind is None or not 0 <= p.answer_start <= len(p.token_ids):
            return None
        try:
            state = self.grammars.compile(Grammar(kind, getattr(p.grammar, kind)))
        except InvalidRequestError as e:  # the target compiled it: a different llguidance or tokenizer here
            log.warning("cannot compile the sequence's grammar; drafting without it", target=self.target_id,
                        seq_id=p.seq_id, error=str(e))
            return None
        if not self._said_grammar:
            self._said_grammar = True
            log.info("drafting structured output under its grammar", target=self.target_id, seq_id=p.seq_id, kind=kind)
        return state

    def _outcome(self, o: draft_pb2.Outcome) -> DraftRecord:
        seq = self.seqs.get(o.seq_id)
        if seq is None:
            raise UnknownSequenceError(f"unknown sequence id {o.seq_id} on this session; send a Prefill first")
        if not 0 <= o.num_committed_before <= len(seq.token_ids):
            raise InvalidRequestError(f"sequence {o.seq_id}: num_committed_before {o.num_committed_before} "
                                      f"is past the {len(seq.token_ids)} tokens the draft holds")
        check_tokens(o.new_token_ids, self.vocab_size, self.limits, o.num_committed_before + len(o.new_token_ids))
        outcome = round_outcome(seq.seq_id, o)
        seq.commit(outcome)
        self._features(seq, o)
        self.proposer.observe(seq.seq_id, outcome)
        return seq

    def _apply(self, round_: draft_pb2.Round, out: draft_pb2.Speculations) -> list[tuple[int, DraftRecord]]:
        """Apply the round's prefills and outcomes; the sequences to propose for (errors go to `out`)."""
        ready: list[tuple[int, DraftRecord]] = []
        for p in round_.prefills:
            if not p.token_ids:
                out.errors.add(seq_id=p.seq_id, code="INVALID_ARGUMENT", message="a Prefill needs its tokens")
                continue
            try:
                ready.append((p.seq_id, self._prefill(p)))
            except (InvalidRequestError, ResourceExhaustedError, PrefixUnavailableError) as e:  # refused: no state
                self.release([p.seq_id])
                out.errors.add(seq_id=p.seq_id, code=_code(e), message=str(e))
        for o in round_.outcomes:
            try:
                ready.append((o.seq_id, self._outcome(o)))
            except UnknownSequenceError as e:
                out.errors.add(seq_id=o.seq_id, code="NOT_FOUND", message=str(e))
            except InvalidRequestError as e:
                self.release([o.seq_id])  # its tokens or features are no longer known: the target re-sends a Prefill
                out.errors.add(seq_id=o.seq_id, code="INVALID_ARGUMENT", message=str(e))
        return ready

    def run_round(self, round_: draft_pb2.Round) -> draft_pb2.Speculations:
        """`answer`, then its SSD build at once (no overlap: for tests and in-process use)."""
        result = self.answer(round_)
        if result.build is not None:
            self.build(result.build)
        return result.speculations

    def catch_up(self, round_: draft_pb2.Round) -> None:
        """A catch_up message (the target took plain steps): apply its prefills and outcomes, then bring the draft's
        model state up to those sequences' committed tokens in one forward, answering nothing (worker thread). A
        sequence refused here is forgotten (its next round's Outcome gets NOT_FOUND: the target re-sends it)."""
        out = draft_pb2.Speculations()
        ready = [seq for _, seq in self._apply(round_, out)]
        for e in out.errors:
            log.info("catch-up refused a sequence", target=self.target_id, seq_id=e.seq_id, code=e.code, error=e.message)
        ready = [seq for seq in ready if not self.feature_width or seq.has_features]
        if not ready:
            return
        try:
            self.proposer.catch_up([self._request(seq, 0, None) for seq in ready])
        except (InvalidRequestError, ResourceExhaustedError) as e:  # e.g. the draft's KV is full: its rounds catch up
            log.warning("draft catch-up failed; the next rounds catch up instead", target=self.target_id, error=str(e))

    def answer(self, round_: draft_pb2.Round, wait_s: float = 0.0) -> RoundResult:
        """Apply prefills and outcomes, answer every sequence that is valid (SSD ones from the cache) and return
        the SSD build to run next. Runs in the draft's worker thread; `wait_s`: how long it queued for it."""
        check_round(round_, self.limits)  # before any state changes: a refused round leaves the session as it was
        out = draft_pb2.Speculations()
        ready = self._apply(round_, out)
        k = round_.num_speculative_tokens
        if not ready or k < 1:
            return RoundResult(out)
        tree = None
        if round_.HasField("tree"):
            tree = TreeShape(budget=round_.tree.budget, depth=round_.tree.depth, top_k=round_.tree.top_k)
        speculations: dict[int, Speculation] = {}  # target seq id -> its answer
        plain, ssd = [], []
        for seq_id, seq in ready:
            if self.feature_width and not seq.has_features:
                speculations[seq_id] = Speculation([])  # empty: the target takes a plain decode step
            else:
                (ssd if seq.mode is DecodeMode.SSD else plain).append((seq_id, seq))
        if plain:
            proposed = self.proposer.propose([self._request(seq, k, tree) for _, seq in plain])
            speculations.update(zip((seq_id for seq_id, _ in plain), proposed, strict=True))
        job = self._answer_ssd(round_, ssd, k, speculations, out, wait_s) if ssd else None
        answered = [(seq_id, speculations[seq_id]) for seq_id, _ in ready if seq_id in speculations]
        self.tensors.start_message(sum(s.q.numel() * 4 for _, s in answered if s.q is not None))  # q as float32
        for seq_id, speculation in answered:
            out.items.append(to_message(seq_id, speculation, self.tensors))
        return RoundResult(out, job)

    def _answer_ssd(self, round_: draft_pb2.Round, asking: list[tuple[int, DraftRecord]], k: int,
                    speculations: dict[int, Speculation], out: draft_pb2.Speculations,
                    wait_s: float) -> BuildJob | None:
        """SSD sequences' answers (cache hits, or backups for the misses) into `speculations`; the build to run next.
        A round's deprecated options (older targets) apply over the session's; bad ones are an INVALID_ARGUMENT
        error for each of these sequences (the session goes on)."""
        assert self.ssd is not None  # only sequences in SSD mode get here
        try:
            config = options_config(self.ssd_config, round_.ssd) if round_.HasField("ssd") else self.ssd_config
        except InvalidRequestError as e:
            for seq_id, _ in asking:
                out.errors.add(seq_id=seq_id, code="INVALID_ARGUMENT", message=f"SSD options: {e}")
            return None
        sd_round = set(round_.sd_round_seq_ids)  # drafted now, no cache built (the target's mode auto chose SD)
        requests = [self._request(seq, k, None, seq_id in sd_round) for seq_id, seq in asking]  # SSD: chains
        answers, job = self.ssd.answer(requests, [seq for _, seq in asking], config, waited_s=wait_s)
        speculations.update(zip((seq_id for seq_id, _ in asking), answers, strict=True))
        out.timings.CopyFrom(timings(self.ssd.counters, self.last_build_s, self.last_build_budget, wait_s))
        return job

    def build(self, job: BuildJob) -> None:
        """Build the speculation caches for an answer already sent (worker thread). A failure is logged and
        leaves those caches empty: the next lookups miss and get a backup; the session goes on."""
        assert self.ssd is not None  # only `_answer_ssd` makes jobs
        started = time.perf_counter()
        try:
            self.ssd.build(job)
        except Exception:  # noqa: BLE001 - any model failure: log it, the next round falls back to a backup
            log.exception("SSD cache build failed; the next lookups of these sequences miss",
                          target=self.target_id, num_sequences=len(job.pending))
        finally:
            self.last_build_s = time.perf_counter() - started
            self.last_build_budget = self.ssd.counters.last_fan_out_budget

    def _request(self, seq: DraftRecord, k: int, tree: TreeShape | None, sd_round: bool = False) -> ProposeRequest:
        features_start, features = seq.features.take()  # [n, F] or None
        return ProposeRequest(seq.seq_id, list(seq.token_ids), k, seq.temperature, seq.generator, tree,
                              features, features_start, mode=seq.mode, grammar=seq.answer_grammar(), sd_round=sd_round)

    def release(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            seq = self.seqs.pop(seq_id, None)
            if seq is not None and seq.mode is DecodeMode.SSD and self.ssd is not None:
                self.ssd.release(seq)  # its model state, and the proposer's
            elif seq is not None:
                self.proposer.release(seq.seq_id)

    def close(self) -> None:
        self.release(list(self.seqs))
        self.tensors.close()  # unlinks this session's shared-memory segment, if any


def round_outcome(internal_id: int, o: draft_pb2.Outcome) -> RoundOutcome:
    """The target's outcome as the proposer takes it; InvalidRequestError if its k or bonus contradict its tokens."""
    k, new = o.num_accepted, list(o.new_token_ids)
    if k < NO_SPECULATION or k > len(new) - 1:
        raise InvalidRequestError(f"sequence {o.seq_id}: num_accepted {k} with {len(new)} new tokens")
    if k >= 0 and o.bonus_token != new[-1]:
        raise InvalidRequestError(f"sequence {o.seq_id}: bonus_token {o.bonus_token} is not the last new token")
    own = o.num_own_accepted if o.HasField("num_own_accepted") else None
    if own is not None and not 0 <= own <= max(k, 0):
        raise InvalidRequestError(f"sequence {o.seq_id}: num_own_accepted {own} with num_accepted {k}")
    return RoundOutcome(internal_id, o.num_committed_before, new, k, own)


def _code(error: Exception) -> str:
    if isinstance(error, PrefixUnavailableError):
        return "FAILED_PRECONDITION"  # the target resends the Prefill whole
    return "RESOURCE_EXHAUSTED" if isinstance(error, ResourceExhaustedError) else "INVALID_ARGUMENT"


def to_message(seq_id: int, speculation: Speculation, tensors: SessionTensors) -> draft_pb2.SequenceSpeculation:
    msg = draft_pb2.SequenceSpeculation(seq_id=seq_id, token_ids=speculation.tokens, parents=speculation.parents or [],
                                        is_cache_hit=bool(speculation.cache_hit))
    if speculation.predicted_hit is not None:  # SSD, once a build has predicted it
        msg.predicted_hit = speculation.predicted_hit
    if speculation.q is not None:  # [n, V] float32
        msg.q.CopyFrom(torch_tensors.encode(tensors, speculation.q.float()))
    return msg
