"""Each sequence's deadline on the draft, from its Prefill's `time_left_ms`: past it the draft drops the sequence
by itself (its KV and speculation-cache entries are freed even if the target never sends the Release) and
answers anything that names it with DEADLINE_EXCEEDED.

One SessionDeadlines per session, used on the servicer's event loop only (not thread-safe). Deadlines are on the
draft's own monotonic clock: the time left is counted from when the Prefill arrived.
"""

import time
from collections import OrderedDict
from collections.abc import Callable

REMEMBERED_EXPIRED = 4096  # ids of expired sequences kept to answer DEADLINE_EXCEEDED (oldest forgotten first)
SWEEP_INTERVAL_S = 0.1  # how often a session looks for sequences whose deadline passed


class SessionDeadlines:
    def __init__(self, clock: Callable[[], float] = time.monotonic, remembered: int = REMEMBERED_EXPIRED) -> None:
        self.clock = clock
        self.remembered = remembered
        self._deadlines: dict[int, float] = {}  # target seq id -> deadline (clock seconds)
        self._expired: OrderedDict[int, None] = OrderedDict()  # recently expired ids, oldest first

    def start(self, seq_id: int, time_left_ms: int | None) -> None:
        """A Prefill: the sequence's deadline from now (None: it has none; a re-Prefill replaces the old one)."""
        self._expired.pop(seq_id, None)
        if time_left_ms is None:
            self._deadlines.pop(seq_id, None)
        else:
            self._deadlines[seq_id] = self.clock() + time_left_ms / 1000.0

    def forget(self, seq_id: int) -> None:
        """A Release (or a refused sequence): it no longer has a deadline here."""
        self._deadlines.pop(seq_id, None)

    def due(self) -> list[int]:
        """Ids whose deadline passed since the last call; they move to the expired ids."""
        now = self.clock()
        passed = [seq_id for seq_id, deadline in self._deadlines.items() if deadline <= now]
        for seq_id in passed:
            del self._deadlines[seq_id]
            self._expired[seq_id] = None
        while len(self._expired) > self.remembered:
            self._expired.popitem(last=False)
        return passed

    def is_expired(self, seq_id: int) -> bool:
        return seq_id in self._expired

    def __len__(self) -> int:
        return len(self._deadlines)
