"""Admission control in front of generation: bounded, so overload is refused at once and never queued without end.

At most `max_in_flight` generation requests run (HTTP and gRPC together); up to `max_waiting` more wait for a
slot in arrival order (FIFO), each no longer than its deadline. Past that, and past an API key's concurrency
limit (in flight + waiting) or rate limit (a token bucket), a request is refused with `Overloaded` (429 with
Retry-After / RESOURCE_EXHAUSTED). A `Ticket` is the held slot; releasing it hands the slot to the next waiter.
"""

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from gateway.errors import DeadlineExceeded, Overloaded

QUEUE_FULL_RETRY_S = 1.0  # Retry-After when the queue (or a key's concurrency) is full


class TokenBucket:
    """`rate_per_s` tokens a second, at most `capacity` saved; a request takes one."""

    def __init__(self, rate_per_s: float, capacity: int, now: float) -> None:
        self.rate_per_s, self.capacity = rate_per_s, capacity
        self.tokens, self.last = float(capacity), now

    def take(self, now: float) -> float:
        """0.0 when a token was taken; else the seconds until one is there (nothing taken)."""
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate_per_s)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class Ticket:
    """One admitted request's slot (and its key's count); `release` is idempotent."""

    def __init__(self, admission: "Admission", key: str) -> None:
        self._admission, self._key = admission, key
        self.is_released = False

    def release(self) -> None:
        if not self.is_released:
            self.is_released = True
            self._admission._release(self._key)


class Admission:
    def __init__(self, max_in_flight: int, max_waiting: int, max_key_in_flight: int | None = None,
                 key_requests_per_minute: float | None = None, key_burst: int | None = None,
                 on_reject: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_in_flight, self.max_waiting = max_in_flight, max_waiting
        self.max_key_in_flight = max_key_in_flight
        self.key_rate_per_s = key_requests_per_minute / 60.0 if key_requests_per_minute else None
        self.key_burst = key_burst or max(1, math.ceil(key_requests_per_minute or 1))
        self.on_reject, self.clock = on_reject, clock
        self.num_in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._key_counts: dict[str, int] = {}  # in flight + waiting, per key
        self._buckets: dict[str, TokenBucket] = {}

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    def _refuse(self, reason: str, message: str, retry_after_s: float) -> Overloaded:
        self.on_reject(reason)
        return Overloaded(message, retry_after_s)

    def _check_key(self, key: str) -> None:
        if self.max_key_in_flight is not None and self._key_counts.get(key, 0) >= self.max_key_in_flight:
            raise self._refuse("key_concurrency", f"this API key has {self.max_key_in_flight} requests in "
                                                  "flight, its limit; retry when one is done", QUEUE_FULL_RETRY_S)
        if self.key_rate_per_s is not None:
            now = self.clock()
            bucket = self._buckets.setdefault(key, TokenBucket(self.key_rate_per_s, self.key_burst, now))
            wait_s = bucket.take(now)
            if wait_s > 0:
                raise self._refuse("key_rate", "this API key is past its rate limit "
                                               f"({self.key_rate_per_s * 60:g} requests per minute)", wait_s)

    async def admit(self, key: str, deadline: float | None = None) -> Ticket:
        """A slot for one request of `key` (waiting for it until `deadline`, on `clock`); raises Overloaded or
        DeadlineExceeded."""
        self._check_key(key)
        self._key_counts[key] = self._key_counts.get(key, 0) + 1
        try:
            await self._acquire(deadline)
        except BaseException:
            self._forget_key(key)
            raise
        return Ticket(self, key)

    @asynccontextmanager
    async def slot(self, key: str, deadline: float | None = None) -> AsyncIterator[None]:
        ticket = await self.admit(key, deadline)
        try:
            yield
        finally:
            ticket.release()

    async def _acquire(self, deadline: float | None) -> None:
        if self.num_in_flight < self.max_in_flight and not self._waiters:
            self.num_in_flight += 1
            return
        if len(self._waiters) >= self.max_waiting:
            raise self._refuse("queue_full", f"the server is busy ({self.num_in_flight} requests in flight, "
                                             f"{len(self._waiters)} waiting); retry shortly", QUEUE_FULL_RETRY_S)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - self.clock())):
                await waiter
        except BaseException as e:
            if waiter.done() and not waiter.cancelled():  # the slot was handed over as we left: pass it on
                self._hand_on()
            else:
                waiter.cancel()
                self._waiters.remove(waiter)
            if isinstance(e, TimeoutError):
                self.on_reject("deadline")
                raise DeadlineExceeded("the request's deadline passed while it waited for a slot") from None
            raise

    def _hand_on(self) -> None:
        """Give a freed slot to the first live waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.num_in_flight -= 1

    def _forget_key(self, key: str) -> None:
        self._key_counts[key] -= 1
        if not self._key_counts[key]:
            del self._key_counts[key]

    def _release(self, key: str) -> None:
        self._forget_key(key)
        self._hand_on()
