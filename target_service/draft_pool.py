"""The target's draft sessions, one per `--draft-address`: which draft each sequence is on, and reconnects.

A new sequence goes to the healthy session holding the fewest of this target's sequences (ties: the first
address; a draft shared with other targets is not asked for its own load). It stays there while that session
is up; when it breaks (the draft died, a round timed out) the sequence moves to the least-loaded healthy
session on its next round, and is re-sent there as a Prefill (that session does not know it). Each address
has a background thread that reopens its session whenever it is down. With no healthy session a sequence has
no home: its rounds get no speculation (plain decode, same output).
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from target_service.draft_session import DraftSession

log = structlog.get_logger(__name__)

OpenSession = Callable[[str], DraftSession | None]  # address -> an open session (handshake done), or None


@dataclass
class DraftSlot:
    """One draft address: its current session (None until the first open) and the sequences homed on it."""

    address: str
    session: DraftSession | None = None
    seq_ids: set[int] = field(default_factory=set)

    @property
    def is_healthy(self) -> bool:
        return self.session is not None and not self.session.is_broken


class DraftPool:
    """Owns one DraftSession per address. `session_for` / `release` are called from the engine thread only;
    the reconnect threads only install sessions (under the lock)."""

    def __init__(self, addresses: list[str], open_session: OpenSession, reconnect_interval_s: float = 0.5) -> None:
        if not addresses:
            raise ValueError("a draft pool needs at least one address")
        self.slots = [DraftSlot(a) for a in addresses]
        self._open_session = open_session
        self.reconnect_interval_s = reconnect_interval_s
        self._home: dict[int, DraftSlot] = {}  # seq id -> the slot whose draft holds (or will hold) it
        self._stop = threading.Event()
        self._lock = threading.Lock()  # orders close() against a reconnect thread installing a session
        self._threads = [threading.Thread(target=self._keep_connected, args=(slot,), daemon=True,
                                          name=f"draft-reconnect-{i}") for i, slot in enumerate(self.slots)]
        for thread in self._threads:
            thread.start()

    @property
    def is_connected(self) -> bool:
        """Whether at least one draft session is up."""
        return any(slot.is_healthy for slot in self.slots)

    @property
    def num_healthy(self) -> int:
        return sum(slot.is_healthy for slot in self.slots)

    @property
    def sessions(self) -> list[DraftSession | None]:
        """Each address's current session (None before its first open), in address order."""
        return [slot.session for slot in self.slots]

    def num_sequences(self, address: str) -> int:
        """Sequences homed on the draft at `address` (for tests and logs)."""
        return sum(len(slot.seq_ids) for slot in self.slots if slot.address == address)

    # -- placement (engine thread) ------------------------------------------------------------
    def session_for(self, seq_id: int) -> DraftSession | None:
        """The session the sequence's round goes to: its home's while that is up, else the least-loaded healthy
        one (the sequence moves there); None when no draft is up."""
        slot = self._home.get(seq_id)
        if slot is not None and slot.is_healthy:
            return slot.session
        healthy = [s for s in self.slots if s.is_healthy]
        if not healthy:
            return None
        new = min(healthy, key=lambda s: len(s.seq_ids))  # min keeps the first of equals: address order
        if slot is not None:
            slot.seq_ids.discard(seq_id)
            log.info("sequence moved to another draft", seq_id=seq_id, old=slot.address, new=new.address)
        new.seq_ids.add(seq_id)
        self._home[seq_id] = new
        return new.session

    def session_of(self, seq_id: int) -> DraftSession | None:
        """The session of the sequence's home if that is up, else None (it does not move the sequence)."""
        slot = self._home.get(seq_id)
        return slot.session if slot is not None and slot.is_healthy else None

    def release(self, seq_id: int) -> DraftSession | None:
        """Forget the sequence; returns the session of its home if that is up (to tell the draft), else None."""
        slot = self._home.pop(seq_id, None)
        if slot is None:
            return None
        slot.seq_ids.discard(seq_id)
        return slot.session if slot.is_healthy else None

    # -- connection (one thread per address) --------------------------------------------------
    def _keep_connected(self, slot: DraftSlot) -> None:
        while not self._stop.is_set():
            if not slot.is_healthy:
                session = self._open_session(slot.address)
                if session is not None:
                    with self._lock:  # close() may run meanwhile: a session opened after it is closed at once
                        if self._stop.is_set():
                            old = session
                        else:
                            old, slot.session = slot.session, session
                    if old is not None:
                        old.close()
            self._stop.wait(self.reconnect_interval_s)

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            sessions = [slot.session for slot in self.slots]
        for session in sessions:
            if session is not None:
                session.close()
