"""One open Speculator.Session stream seen from the target: requests in, a reader thread queuing answers.

It also keeps what the draft holds on this session (`known`: committed tokens sent, the outcome to send) and
the session's tensor transport (inline, shared memory or CUDA IPC, as the draft's Ready agreed). The catch-ups the
draft has yet to acknowledge (those that brought it new prompts) are kept apart: the reader thread takes their
CaughtUp answers off the stream, so a round's `receive` never sees them.
"""

import queue
import threading
import time
from dataclasses import dataclass

import grpc
import structlog

from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from rpc.tensors import SessionTensors
from ssd.speculation.round_outcome import RoundOutcome

log = structlog.get_logger(__name__)

CLOSE = object()  # ends a session's request iterator


@dataclass
class SentSequence:
    num_sent: int  # committed tokens the draft holds
    outcome: RoundOutcome | None = None  # the verified outcome of the draft's last answer (sent as its Outcome)


class DraftSession:
    """One open Session stream: a request queue in, a reader thread filling a response queue."""

    def __init__(self, channel: grpc.Channel, tensors: SessionTensors | None = None) -> None:
        self.channel = channel
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.responses: queue.SimpleQueue = queue.SimpleQueue()
        self.known: dict[int, SentSequence] = {}  # sequences the draft holds on this session
        self.is_broken = False
        self.sends_features = False  # whether the draft drafts from target features (set by its Ready)
        self.tensors = tensors or SessionTensors()  # inline until the draft's Ready agrees on more
        self.acknowledges_catch_ups = False  # whether the draft answers a catch_up sent with a round id (its Ready)
        self.catch_ups: dict[int, float] = {}  # round id -> when sent (monotonic s), of catch-ups not yet answered
        self._catch_ups_lock = threading.Lock()  # the engine thread adds, the reader thread removes
        stub = draft_pb2_grpc.SpeculatorStub(channel)
        self.call = stub.Session(iter(self.requests.get, CLOSE))
        threading.Thread(target=self._read, daemon=True, name="draft-session-reader").start()

    def _read(self) -> None:
        try:
            for response in self.call:
                if response.WhichOneof("kind") == "caught_up":
                    with self._catch_ups_lock:
                        self.catch_ups.pop(response.round_id, None)
                else:
                    self.responses.put(response)
        except grpc.RpcError as e:
            log.warning("draft session broke", code=e.code().name if e.code() else None)
        finally:
            self.is_broken = True
            self.responses.put(None)

    def send(self, msg: draft_pb2.SessionRequest) -> None:
        self.requests.put(msg)

    def send_catch_up(self, round_id: int, message: draft_pb2.Round) -> None:
        """Send a catch_up that the draft acknowledges when it has run it (`round_id` > 0, a draft that does)."""
        with self._catch_ups_lock:
            self.catch_ups[round_id] = time.monotonic()
        self.send(draft_pb2.SessionRequest(round_id=round_id, catch_up=message))

    def is_catching_up(self, timeout_s: float) -> bool:
        """Whether the draft is still running a catch-up sent less than `timeout_s` ago (one it has not answered in
        that time counts no longer: a stalled draft shows in its next round's answer)."""
        if self.is_broken:
            return False
        with self._catch_ups_lock:
            oldest = min(self.catch_ups.values(), default=None)
        return oldest is not None and time.monotonic() - oldest < timeout_s

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
        self.requests.put(CLOSE)
        self.call.cancel()
        self.channel.close()
        self.tensors.close()  # unlinks this session's shared-memory segment, if any
