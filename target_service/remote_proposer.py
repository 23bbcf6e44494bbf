"""RemoteProposer: the engine's Proposer protocol over long-lived Speculator.Session streams, one per draft.

Called from the engine thread only. The DraftPool (draft_pool.py) says which draft session each sequence
is on; each `propose` sends one Round per session holding part of the batch (prefills for sequences that
draft has not seen, for the others an Outcome: the new tokens and the verifier's k and bonus, copied as is),
then waits for each Speculations with the same round id. If a draft is unreachable, slow past the timeout, or
its stream breaks, the affected rounds get empty speculations (a plain decode step: output is unchanged), its sequences move to another healthy
draft (re-sent there as Prefills), and a background thread reopens its session.

A draft that drafts from target features (EAGLE-3) names their layers in GetInfo / Ready; the
engine computes them (known before it is built: `fetch_feature_layers`) and each Prefill / Outcome
carries the features of its new positions. They are kept (sent_features.py), so a sequence's Prefill on
another draft (or a reopened session) carries them all. A Prefill whose prompt the target's prefix cache
served in part says so (`num_cached_tokens` = N) and carries features from position N - 1 only: the draft
takes the rest from its own prefix cache, or answers FAILED_PRECONDITION, and the sequence is resent whole.

Mode auto's plain steps: `catch_up` sends each session a `catch_up` message (the sequences' Prefills or Outcomes,
with features), so the draft keeps up while the target decodes plainly. One that brings new prompts asks to be
acknowledged (a draft whose Ready says it does so answers CaughtUp once it has run it): until then the draft is
busy prefilling them (`catching_up`), and a speculative round would wait for it.

SSD: a sequence whose request asks for ssd goes to the draft with Prefill.mode SSD; the session's Hello
carries the optional `ssd_options`; the answers' cache-hit flags, predictions and draft timings come back.
"""

import dataclasses
import itertools
import time

import grpc
import structlog
import torch

from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from rpc.options import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES
from rpc.tls import sync_channel
from rpc.tls_files import TlsFiles
from ssd.config import DecodeMode, SsdConfig
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import NO_SPECULATION, RoundOutcome
from ssd.speculation.speculation import Speculation
from target_service.draft_pool import DraftPool
from target_service.draft_session import DraftSession, SentSequence
from target_service.sent_features import SentFeatures
from target_service.seq_deadlines import SeqDeadlines
from target_service.ssd_wire import PREFILL_MODES, DraftTimings, ssd_options
from tensor_transport import torch_tensors

log = structlog.get_logger(__name__)

FeatureCarrier = draft_pb2.Prefill | draft_pb2.Outcome  # the round messages that carry target features
CPU = torch.device("cpu")  # the engine samples and verifies on the host
_MAX_INLINE_FEATURE_BYTES = MAX_MESSAGE_BYTES // 2  # per Round; features past it are left out (no speculation)
_INFO_TRY_S = 2.0  # with several drafts: how long one GetInfo waits before the next draft is asked


def fetch_feature_layers(addresses: str | list[str], timeout_s: float, tls: TlsFiles | None = None) -> tuple[int, ...]:
    """The target layers whose features the drafts need (the first GetInfo answer: a target's drafts all draft from
    the same layers), asking the drafts in turn for up to `timeout_s` in all while they start."""
    addresses = [addresses] if isinstance(addresses, str) else list(addresses)
    deadline = time.monotonic() + timeout_s
    for address in itertools.cycle(addresses):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        wait_s = remaining if len(addresses) == 1 else min(remaining, _INFO_TRY_S)  # a down draft delays no other
        with sync_channel(address, tls, CHANNEL_OPTIONS) as channel:
            try:
                info = draft_pb2_grpc.SpeculatorStub(channel).GetInfo(draft_pb2.DraftInfoRequest(), timeout=wait_s,
                                                                       wait_for_ready=True)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue
                log.warning("the draft did not answer GetInfo; computing no target features for it",
                            address=address, code=e.code().name if e.code() else None)
                return ()
        return tuple(info.feature_layers)
    log.warning("no draft answered GetInfo; computing no target features", addresses=addresses, timeout_s=timeout_s)
    return ()


class RemoteProposer:
    """The draft works in its own process, so `catch_up` (a message; one that brings prompts is acknowledged, the
    target goes on meanwhile) runs it beside the target.
    `feature_layers`: the target layers whose features the draft needs (its GetInfo), fixed at start-up.
    `ssd_options`: the session's SSD settings, sent in each session's Hello; None = the draft's defaults."""

    feeds_in_background = True

    def __init__(self, addresses: str | list[str], target_id: str, vocab_size: int, timeout_s: float = 5.0,
                 reconnect_interval_s: float = 0.5, feature_layers: tuple[int, ...] = (),
                 offer_shared_memory: bool = True, ssd_options: SsdConfig | None = None,
                 device: torch.device | None = None, tls: TlsFiles | None = None) -> None:
        self.addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        self.tls = tls  # with a CA: the session runs over TLS (mutual, with this target's certificate)
        self.ssd_options = ssd_options
        self._timings = DraftTimings()  # the draft's SSD timings, summed (engine thread writes)
        self.feature_layers = tuple(feature_layers)
        self.offer_shared_memory = offer_shared_memory  # same-node transports (shared memory, CUDA IPC) offered
        self.device = device  # where the target's features live: a GPU offers CUDA IPC
        self.target_id = target_id
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self._round_ids = itertools.count(1)
        self._refused_for_features = False
        # a sequence may move or be resent whole: its features so far go with its Prefill
        self.sent_features = SentFeatures() if self.feature_layers else None
        self._resend_whole: set[int] = set()  # sequences a draft refused for lack of prefix blocks: N = 0 next
        self.pool = DraftPool(self.addresses, self._open, reconnect_interval_s)  # opens the sessions in background
        self.deadlines = SeqDeadlines()  # the servicer's callers' deadlines; each Prefill carries the time left

    @property
    def is_connected(self) -> bool:
        """Whether at least one draft session is up."""
        return self.pool.is_connected

    @property
    def draft_timings(self) -> DraftTimings:
        """A snapshot of the draft's SSD timings summed over its SSD answers (benchmarks)."""
        return dataclasses.replace(self._timings)

    # -- connection -------------------------------------------------------------------------
    def _open(self, address: str) -> DraftSession | None:
        """A session to the draft at `address`, handshake done; None if it is down or refuses (the pool retries)."""
        try:
            return self._handshake(address)
        except grpc.RpcError as e:
            log.warning("draft session failed to open", address=address, code=e.code().name)
            return None

    def _handshake(self, address: str) -> DraftSession | None:
        channel = sync_channel(address, self.tls, CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(channel).result(timeout=2.0)
        except grpc.FutureTimeoutError:
            channel.close()
            return None
        session = DraftSession(channel, torch_tensors.session_tensors(self.device, self.offer_shared_memory))
        round_id = next(self._round_ids)
        offer = session.tensors.offer(enabled=self.offer_shared_memory)
        hello = draft_pb2.Hello(target_id=self.target_id, vocab_size=self.vocab_size, transports=offer.transports)
        if self.ssd_options is not None:
            hello.ssd.CopyFrom(ssd_options(self.ssd_options))
        if offer.shm_probe is not None:
            hello.shm_probe.CopyFrom(offer.shm_probe)
        if offer.cuda_probe is not None:
            hello.cuda_probe.CopyFrom(offer.cuda_probe)
        session.send(draft_pb2.SessionRequest(round_id=round_id, hello=hello))
        answer = session.receive(round_id, self.timeout_s)
        if answer is None or answer.WhichOneof("kind") != "ready":
            reason = answer.error.message if answer is not None and answer.HasField("error") else "no answer"
            log.warning("draft session refused", address=address, reason=reason)
            session.close()
            return None
        needed = tuple(answer.ready.feature_layers)
        if needed and needed != self.feature_layers:
            (log.debug if self._refused_for_features else log.warning)(
                "the draft needs target features this target does not compute; decoding without it until the "
                "target restarts (its --draft-feature-layers)", address=address,
                draft_feature_layers=needed, target_feature_layers=self.feature_layers)
            self._refused_for_features = True  # warned once; the reconnect loop keeps asking quietly
            session.close()
            return None
        session.sends_features = bool(needed)
        session.acknowledges_catch_ups = answer.ready.acknowledges_catch_ups
        transport = session.tensors.settle(answer.ready.transport)
        log.info("draft session open", address=address, draft=answer.ready.draft_name, feature_layers=needed,
                 tensor_transport=common_pb2.TensorTransport.Name(transport))
        return session

    def close(self) -> None:
        self.pool.close()

    # -- the Proposer protocol --------------------------------------------------------------
    def _entry(self, session: DraftSession, r: ProposeRequest, round_: draft_pb2.Round) -> FeatureCarrier:
        """Add the sequence's Prefill (new to the draft) or Outcome (the delta) to the round."""
        state = session.known.get(r.seq_id)
        if state is None:
            prefill = round_.prefills.add(seq_id=r.seq_id, token_ids=r.token_ids, temperature=r.temperature,
                                          seed=r.generator.initial_seed() & 0x7FFF_FFFF_FFFF_FFFF,
                                          mode=PREFILL_MODES[r.mode])
            if (time_left_ms := self.deadlines.time_left_ms(r.seq_id)) is not None:  # unset: no deadline
                prefill.time_left_ms = time_left_ms
            if r.grammar is not None:  # the draft compiles it too, to propose only what it allows
                grammar = r.grammar.state.grammar
                prefill.grammar.CopyFrom(common_pb2.Grammar(**{grammar.kind: grammar.source}))
                prefill.answer_start = len(r.token_ids) - len(r.grammar.output_ids)
            if session.sends_features and r.seq_id not in self._resend_whole:
                prefill.num_cached_tokens = r.num_cached_tokens  # the draft's own prefix cache covers them
            return prefill
        o = state.outcome  # the verifier's count, copied as is
        msg = round_.outcomes.add(seq_id=r.seq_id, num_committed_before=state.num_sent,
                                  new_token_ids=r.token_ids[state.num_sent :],
                                  num_accepted=o.num_accepted if o is not None else NO_SPECULATION,
                                  bonus_token=o.bonus_token if o is not None else 0)
        if o is not None and o.num_own_accepted is not None:
            msg.num_own_accepted = o.num_own_accepted
        return msg

    def _replayed(self, r: ProposeRequest, msg: FeatureCarrier) -> ProposeRequest:
        """A Prefill of a sequence whose sent features are kept carries them all (it may be new to this draft
        only because it moved here); anything else carries the request's new features."""
        rows = self.sent_features.replay(r.seq_id) if self.sent_features is not None else None
        if not isinstance(msg, draft_pb2.Prefill):
            return r
        if rows is not None:
            r = dataclasses.replace(r, features=rows, features_start=0)  # rows: [n, F], positions 0..n-1
        skip = msg.num_cached_tokens - 1  # positions the draft's prefix cache covers
        if r.features is None or skip <= r.features_start:
            return r
        return dataclasses.replace(r, features=r.features[skip - r.features_start :], features_start=skip)

    def _attach_features(self, session: DraftSession, entries: list[tuple[ProposeRequest, FeatureCarrier]]) -> None:
        """Each message gets its sequence's new target features: by the session's transport, inline within a
        byte budget (a sequence left out sees a gap on the draft and goes without speculation)."""
        carried = [(msg, r) for r, msg in entries if r.features is not None]
        session.tensors.start_message(sum(torch_tensors.wire_bytes(r.features) for _, r in carried))
        room = _MAX_INLINE_FEATURE_BYTES
        for msg, r in carried:  # r.features: [n, F], on the target's device
            tensor = torch_tensors.encode(session.tensors, r.features)
            if tensor.WhichOneof("data") == "inline_bytes":
                if len(tensor.inline_bytes) > room:
                    log.warning("target features do not fit in this round; the sequence goes without speculation",
                                seq_id=r.seq_id, num_bytes=len(tensor.inline_bytes))
                    continue
                room -= len(tensor.inline_bytes)
            msg.features.CopyFrom(tensor)
            msg.features_start = r.features_start

    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]:
        """One Round per draft session holding some of the batch, all sent before any answer is awaited (the
        drafts work in parallel); a session that does not answer in time is closed and its sequences get empty
        speculations (they move to another draft on their next round)."""
        out = [Speculation([]) for _ in requests]
        self._keep_features(requests)
        sent = [(session, indices, self._send_round(session, [requests[i] for i in indices]))
                for session, indices in self._by_session(requests).items()]
        deadline = time.monotonic() + self.timeout_s
        for session, indices, round_id in sent:
            answer = session.receive(round_id, max(deadline - time.monotonic(), 0.001))
            if answer is None or answer.WhichOneof("kind") != "speculations":
                log.warning("no speculations from the draft; decoding without them", round_id=round_id)
                session.close()  # a late answer would desynchronize the stream: start a fresh session
                continue
            speculations = self._apply(session, [requests[i] for i in indices], answer.speculations)
            for i, speculation in zip(indices, speculations, strict=True):
                out[i] = speculation
        return out

    @property
    def catching_up(self) -> bool:
        """Whether some draft is still running a catch-up that brought it new prompts (not yet acknowledged, and
        sent less than the round timeout ago)."""
        return any(s is not None and s.is_catching_up(self.timeout_s) for s in self.pool.sessions)

    def catch_up(self, requests: list[ProposeRequest]) -> None:
        """After a plain step: each session holding some of these sequences gets one catch_up message (their
        Prefills or Outcomes with features, as a round's); the draft catches up while the target steps on. One that
        brings prompts is acknowledged where the draft does that, others get no answer. The draft now holds every
        committed token, so the next round's Outcome carries none new (num_accepted -1: no speculation was
        verified)."""
        self._keep_features(requests)
        for session, indices in self._by_session(requests).items():
            batch = [requests[i] for i in indices]
            message = draft_pb2.Round()
            self._add_sequences(session, batch, message)
            if message.prefills and session.acknowledges_catch_ups:
                session.send_catch_up(next(self._round_ids), message)
            else:
                session.send(draft_pb2.SessionRequest(round_id=0, catch_up=message))
            for r in batch:
                session.known[r.seq_id] = SentSequence(len(r.token_ids))

    def _by_session(self, requests: list[ProposeRequest]) -> dict[DraftSession, list[int]]:
        """The indices into `requests` of each healthy draft session's sequences (the pool places new ones)."""
        batches: dict[DraftSession, list[int]] = {}
        for i, r in enumerate(requests):
            session = self.pool.session_for(r.seq_id)
            if session is not None:
                batches.setdefault(session, []).append(i)
        return batches

    def _add_sequences(self, session: DraftSession, requests: list[ProposeRequest], round_: draft_pb2.Round) -> None:
        """Each sequence's Prefill (new to the draft) or Outcome (the delta) into `round_`, with its features."""
        entries = [(r, self._entry(session, r, round_)) for r in requests]
        if session.sends_features:
            self._attach_features(session, [(self._replayed(r, msg), msg) for r, msg in entries])

    def _keep_features(self, requests: list[ProposeRequest]) -> None:
        """Keep the requests' new features: a sequence's Prefill on another draft carries them all."""
        if self.sent_features is not None:
            for r in requests:
                if r.features is not None:
                    self.sent_features.add(r.seq_id, r.features_start, r.features)

    def _send_round(self, session: DraftSession, requests: list[ProposeRequest]) -> int:
        """Send the session's Round for these sequences (prefills for new ones, outcomes for the others)."""
        round_ = draft_pb2.Round(num_speculative_tokens=max(r.num_tokens for r in requests))
        tree = next((r.tree for r in requests if r.tree is not None), None)
        if tree is not None:
            round_.tree.CopyFrom(draft_pb2.TreeShape(budget=tree.budget, depth=tree.depth, top_k=tree.top_k))
        self._add_sequences(session, requests, round_)
        round_.sd_round_seq_ids.extend(r.seq_id for r in requests if r.sd_round)
        round_id = next(self._round_ids)
        session.send(draft_pb2.SessionRequest(round_id=round_id, round=round_))
        return round_id

    def _apply(self, session: DraftSession, requests: list[ProposeRequest],
               speculations: draft_pb2.Speculations) -> list[Speculation]:
        failed = {e.seq_id for e in speculations.errors}
        for e in speculations.errors:
            if e.code == "FAILED_PRECONDITION":  # the draft lacks the prefix blocks: resend it whole
                self._resend_whole.add(e.seq_id)
                log.info("the draft lacks the sequence's prefix blocks; resending it whole", seq_id=e.seq_id)
                continue
            log.warning("draft rejected a sequence", seq_id=e.seq_id, code=e.code, error=e.message)
        # the draft sends timings only when it answered from its SSD cache (an n-gram draft serves ssd as plain SD)
        answered_ssd = speculations.HasField("timings")
        if answered_ssd:
            self._timings.add(speculations.timings)
        by_id = {item.seq_id: item for item in speculations.items}
        out = []
        for r in requests:
            item = None if r.seq_id in failed else by_id.get(r.seq_id)
            is_ssd = r.mode is DecodeMode.SSD and answered_ssd and not r.sd_round  # an SD round carries no hit flag
            speculation = self._speculation(session, item, is_ssd=is_ssd)
            if speculation is None:
                session.known.pop(r.seq_id, None)  # re-sent as a Prefill next round
                out.append(Speculation([]))
                continue
            session.known[r.seq_id] = SentSequence(len(r.token_ids))
            out.append(speculation)
        return out

    @staticmethod
    def _speculation(session: DraftSession, item: draft_pb2.SequenceSpeculation | None,
                     is_ssd: bool) -> Speculation | None:
        """The draft's answer for one sequence (with its cache-hit flag if SSD answered it); None if it is
        missing or its q cannot be read."""
        if item is None:
            return None
        try:
            q = torch_tensors.decode(session.tensors, item.q, CPU) if item.HasField("q") else None  # [n, V]
        except (ValueError, RuntimeError) as e:  # e.g. a shared-memory segment that is gone
            log.warning("unreadable q from the draft", seq_id=item.seq_id, error=str(e))
            return None
        if not is_ssd:
            return Speculation(list(item.token_ids), list(item.parents) or None, q)
        predicted = item.predicted_hit if item.HasField("predicted_hit") else None
        return Speculation(list(item.token_ids), list(item.parents) or None, q, cache_hit=item.is_cache_hit,
                           predicted_hit=predicted)

    def observe(self, seq_id: int, outcome: RoundOutcome) -> None:
        """Keep the round's outcome for the sequence's next Outcome message. Only the round right after the answer
        verified the draft's speculation; a later one (a plain step in between) leaves num_accepted -1."""
        session = self.pool.session_of(seq_id)
        state = session.known.get(seq_id) if session is not None else None
        if state is not None:
            state.outcome = outcome if outcome.num_committed_before == state.num_sent else None

    def release(self, seq_id: int) -> None:
        self._resend_whole.discard(seq_id)
        if self.sent_features is not None:
            self.sent_features.release(seq_id)
        session = self.pool.release(seq_id)
        if session is not None and session.known.pop(seq_id, None) is not None:
            session.send(draft_pb2.SessionRequest(release=draft_pb2.Release(seq_ids=[seq_id])))
