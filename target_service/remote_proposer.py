"""RemoteProposer: the engine's Proposer protocol over one long-lived Speculator.Session stream.

Called from the engine thread only. Each `propose` sends one Round (prefills for sequences the
draft has not seen, outcomes as deltas for the others) and waits for the Speculations with the
same round id. If the draft is unreachable, slow past the timeout, or the stream breaks, the
affected rounds get empty speculations (a plain decode step: output is unchanged) and a
background thread reopens the session; a new session re-sends every sequence as a Prefill.

A draft that drafts from target features (EAGLE-3) names their layers in GetInfo / Ready; the
engine computes them (known before it is built: `fetch_feature_layers`) and each Prefill / Outcome
carries the features of its new positions. Features are not kept here: a sequence re-sent after a
reconnect lacks its old ones, and the draft gives it empty speculations.
"""

import itertools
import queue
import threading
from dataclasses import dataclass, field

import grpc
import structlog
import torch

from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from rpc.options import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES
from rpc.tensors import from_tensor, to_tensor
from ssd.spec.proposer import ProposeRequest
from ssd.spec.speculation import Speculation

log = structlog.get_logger(__name__)

_CLOSE = object()  # ends a session's request iterator
_MAX_FEATURE_BYTES = MAX_MESSAGE_BYTES // 2  # inline feature bytes per Round; the rest of a round goes without


def fetch_feature_layers(address: str, timeout_s: float) -> tuple[int, ...]:
    """The target layers whose features the draft needs (its GetInfo), waiting up to `timeout_s` for it to serve."""
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        try:
            info = draft_pb2_grpc.SpeculatorStub(channel).GetInfo(draft_pb2.DraftInfoRequest(), timeout=timeout_s,
                                                                   wait_for_ready=True)
        except grpc.RpcError as e:
            log.warning("the draft did not answer GetInfo; computing no target features for it",
                        address=address, code=e.code().name if e.code() else None)
            return ()
    return tuple(info.feature_layers)


def features_tensor(features: torch.Tensor) -> common_pb2.Tensor:
    """[n, F] target features on the wire: bfloat16 as its bit patterns, any other dtype as float32."""
    t = features.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return to_tensor(t.view(torch.int16).numpy(), dtype="bfloat16")
    return to_tensor(t.float().numpy())


@dataclass
class _SeqState:
    num_sent: int  # committed tokens the draft holds
    last_tokens: list[int] = field(default_factory=list)  # the last speculation (a chain), for k accepted


class _Session:
    """One open Session stream: a request queue in, a reader thread filling a response queue."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.responses: queue.SimpleQueue = queue.SimpleQueue()
        self.known: dict[int, _SeqState] = {}  # sequences the draft holds on this session
        self.is_broken = False
        self.sends_features = False  # whether the draft drafts from target features (set by its Ready)
        stub = draft_pb2_grpc.SpeculatorStub(channel)
        self.call = stub.Session(iter(self.requests.get, _CLOSE))
        threading.Thread(target=self._read, daemon=True, name="draft-session-reader").start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.responses.put(response)
        except grpc.RpcError as e:
            log.warning("draft session broke", code=e.code().name if e.code() else None)
        finally:
            self.is_broken = True
            self.responses.put(None)

    def send(self, msg: draft_pb2.SessionRequest) -> None:
        self.requests.put(msg)

    def receive(self, round_id: int, timeout_s: float) -> draft_pb2.SessionResponse | None:
        """The answer to `round_id`, or None if the session broke or the answer is late."""
        while not self.is_broken or not self.responses.empty():
            try:
                response = self.responses.get(timeout=timeout_s)
            except queue.Empty:
                return None
            if response is None:
                return None
            if response.round_id == round_id:
                return response
        return None

    def close(self) -> None:
        self.is_broken = True
        self.requests.put(_CLOSE)
        self.call.cancel()
        self.channel.close()


class RemoteProposer:
    """`feature_layers`: the target layers whose features the draft needs (its GetInfo), fixed at start-up."""

    def __init__(self, address: str, target_id: str, vocab_size: int, timeout_s: float = 5.0,
                 reconnect_interval_s: float = 0.5, feature_layers: tuple[int, ...] = ()) -> None:
        self.address = address
        self.feature_layers = tuple(feature_layers)
        self.target_id = target_id
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.reconnect_interval_s = reconnect_interval_s
        self._session: _Session | None = None
        self._round_ids = itertools.count(1)
        self._refused_for_features = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_connected, daemon=True, name="draft-reconnect")
        self._thread.start()

    @property
    def is_connected(self) -> bool:
        s = self._session
        return s is not None and not s.is_broken

    # -- connection -------------------------------------------------------------------------
    def _open(self) -> _Session | None:
        channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(channel).result(timeout=2.0)
        except grpc.FutureTimeoutError:
            channel.close()
            return None
        session = _Session(channel)
        round_id = next(self._round_ids)
        session.send(draft_pb2.SessionRequest(round_id=round_id, hello=draft_pb2.Hello(
            target_id=self.target_id, vocab_size=self.vocab_size)))
        answer = session.receive(round_id, self.timeout_s)
        if answer is None or answer.WhichOneof("kind") != "ready":
            reason = answer.error.message if answer is not None and answer.HasField("error") else "no answer"
            log.warning("draft session refused", address=self.address, reason=reason)
            session.close()
            return None
        needed = tuple(answer.ready.feature_layers)
        if needed and needed != self.feature_layers:
            (log.debug if self._refused_for_features else log.warning)(
                "the draft needs target features this target does not compute; decoding without it until the "
                "target restarts (its --draft-feature-layers)", address=self.address,
                draft_feature_layers=needed, target_feature_layers=self.feature_layers)
            self._refused_for_features = True  # warned once; the reconnect loop keeps asking quietly
            session.close()
            return None
        session.sends_features = bool(needed)
        log.info("draft session open", address=self.address, draft=answer.ready.draft_name, feature_layers=needed)
        return session

    def _keep_connected(self) -> None:
        while not self._stop.is_set():
            if not self.is_connected:
                try:
                    session = self._open()
                except grpc.RpcError as e:
                    log.warning("draft session failed to open", code=e.code().name)
                    session = None
                if session is not None:
                    old, self._session = self._session, session
                    if old is not None:
                        old.close()
            self._stop.wait(self.reconnect_interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._session is not None:
            self._session.close()

    # -- the Proposer protocol --------------------------------------------------------------
    def _entry(self, session: _Session, r: ProposeRequest, round_: draft_pb2.Round, room: int) -> int:
        """Add the sequence's Prefill or Outcome to the round; returns the feature bytes it used of `room`."""
        state = session.known.get(r.seq_id)
        if state is None:
            msg = round_.prefills.add(seq_id=r.seq_id, token_ids=r.token_ids, temperature=r.temperature,
                                      seed=r.generator.initial_seed() & 0x7FFF_FFFF_FFFF_FFFF)
        else:
            new = r.token_ids[state.num_sent :]
            k = 0
            while k < min(len(state.last_tokens), len(new) - 1) and state.last_tokens[k] == new[k]:
                k += 1
            msg = round_.outcomes.add(seq_id=r.seq_id, num_committed_before=state.num_sent, new_token_ids=new,
                                      num_accepted=k if state.last_tokens else -1, bonus_token=new[-1] if new else 0)
        if not session.sends_features or r.features is None:
            return 0
        num_bytes = r.features.numel() * r.features.element_size()  # [n, F]
        if num_bytes > room:  # the draft sees a gap and stops drafting this sequence; the round still fits
            log.warning("target features do not fit in this round; the sequence goes without speculation",
                        seq_id=r.seq_id, num_bytes=num_bytes)
            return 0
        msg.features.CopyFrom(features_tensor(r.features))
        msg.features_start = r.features_start
        return num_bytes

    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]:
        session = self._session
        empty = [Speculation([]) for _ in requests]
        if session is None or session.is_broken:
            return empty
        round_ = draft_pb2.Round(num_speculative_tokens=max(r.num_tokens for r in requests))
        tree = next((r.tree for r in requests if r.tree is not None), None)
        if tree is not None:
            round_.tree.CopyFrom(draft_pb2.TreeShape(budget=tree.budget, depth=tree.depth, top_k=tree.top_k))
        room = _MAX_FEATURE_BYTES
        for r in requests:
            room -= self._entry(session, r, round_, room)
        round_id = next(self._round_ids)
        session.send(draft_pb2.SessionRequest(round_id=round_id, round=round_))
        answer = session.receive(round_id, self.timeout_s)
        if answer is None or answer.WhichOneof("kind") != "speculations":
            log.warning("no speculations from the draft; decoding without them", round_id=round_id)
            session.close()  # a late answer would desynchronize the stream: start a fresh session
            return empty
        return self._apply(session, requests, answer.speculations)

    def _apply(self, session: _Session, requests: list[ProposeRequest],
               specs: draft_pb2.Speculations) -> list[Speculation]:
        failed = {e.seq_id for e in specs.errors}
        for e in specs.errors:
            log.warning("draft rejected a sequence", seq_id=e.seq_id, code=e.code, error=e.message)
        by_id = {item.seq_id: item for item in specs.items}
        out = []
        for r in requests:
            item = by_id.get(r.seq_id)
            if r.seq_id in failed or item is None:
                session.known.pop(r.seq_id, None)  # re-sent as a Prefill next round
                out.append(Speculation([]))
                continue
            q = torch.from_numpy(from_tensor(item.q).copy()) if item.HasField("q") else None  # [n, V]
            spec = Speculation(list(item.token_ids), list(item.parents) or None, q)
            session.known[r.seq_id] = _SeqState(len(r.token_ids), [] if spec.is_tree else spec.tokens)
            out.append(spec)
        return out

    def commit(self, seq_id: int, num_committed: int) -> None:
        pass  # the next Outcome carries the delta

    def release(self, seq_id: int) -> None:
        session = self._session
        if session is not None and not session.is_broken and session.known.pop(seq_id, None) is not None:
            session.send(draft_pb2.SessionRequest(release=draft_pb2.Release(seq_ids=[seq_id])))
