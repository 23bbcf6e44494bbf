"""Each running sequence's deadline on the target, for the draft: a Prefill carries the time left of it.

The servicer sets a sequence's deadline (the caller's gRPC deadline, on the monotonic clock) once the engine
admitted it and clears it when the stream ends; the RemoteProposer reads it on the engine thread when it sends
the sequence's Prefill, so the draft can drop the sequence by itself once it passed.
"""

import threading
import time


class SeqDeadlines:
    """seq id -> deadline (time.monotonic seconds); thread-safe (event loop writes, engine thread reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}

    def set(self, seq_id: int, deadline: float) -> None:
        with self._lock:
            self._deadlines[seq_id] = deadline

    def clear(self, seq_id: int) -> None:
        with self._lock:
            self._deadlines.pop(seq_id, None)

    def time_left_ms(self, seq_id: int, now: float | None = None) -> int | None:
        """Whole milliseconds left (0 once passed); None when the sequence has no deadline."""
        with self._lock:
            deadline = self._deadlines.get(seq_id)
        if deadline is None:
            return None
        return max(0, int((deadline - (time.monotonic() if now is None else now)) * 1000))

    def __len__(self) -> int:
        with self._lock:
            return len(self._deadlines)
