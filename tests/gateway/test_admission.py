"""The admission queue: FIFO slots, bounded waiting (Overloaded past it), deadlines while waiting, per-key
concurrency and token-bucket rate limits; a waiter that leaves (cancelled, deadline) holds no slot."""

import asyncio

import pytest

from gateway.admission import Admission, TokenBucket
from gateway.errors import DeadlineExceeded, Overloaded


def test_slots_are_handed_on_in_arrival_order_and_the_queue_is_bounded():
    async def scenario() -> list[int]:
        admission = Admission(max_in_flight=1, max_waiting=2)
        order: list[int] = []
        first = await admission.admit("k")

        async def waiter(i: int) -> None:
            async with admission.slot("k"):
                order.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(2)]
        await asyncio.sleep(0)
        assert admission.num_waiting == 2
        with pytest.raises(Overloaded) as e:
            await admission.admit("k")
        assert e.value.retry_after_s > 0 and e.value.http_status == 429
        first.release()
        first.release()  # idempotent
        await asyncio.gather(*tasks)
        assert admission.num_in_flight == 0 and admission.num_waiting == 0
        return order

    assert asyncio.run(scenario()) == [0, 1]


def test_a_waiter_that_leaves_holds_no_slot():
    async def scenario() -> None:
        admission = Admission(max_in_flight=1, max_waiting=4)
        held = await admission.admit("k")
        with pytest.raises(DeadlineExceeded):
            await admission.admit("k", deadline=admission.clock() + 0.01)
        cancelled = asyncio.create_task(admission.admit("k"))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert admission.num_waiting == 0
        held.release()
        assert admission.num_in_flight == 0
        (await admission.admit("k")).release()  # the slot is free

    asyncio.run(scenario())


def test_per_key_concurrency_limit():
    async def scenario() -> None:
        admission = Admission(max_in_flight=10, max_waiting=10, max_key_in_flight=2)
        tickets = [await admission.admit("a"), await admission.admit("a")]
        with pytest.raises(Overloaded):
            await admission.admit("a")
        (await admission.admit("b")).release()  # other keys are not held back
        tickets[0].release()
        (await admission.admit("a")).release()

    asyncio.run(scenario())


def test_per_key_rate_limit_is_a_token_bucket():
    now = [0.0]
    rejected: list[str] = []
    admission = Admission(max_in_flight=10, max_waiting=0, key_requests_per_minute=60, key_burst=2,
                          on_reject=rejected.append, clock=lambda: now[0])

    async def take(key: str = "a") -> None:
        (await admission.admit(key)).release()

    asyncio.run(take())
    asyncio.run(take())
    with pytest.raises(Overloaded) as e:
        asyncio.run(take())
    assert e.value.retry_after_s == pytest.approx(1.0) and rejected == ["key_rate"]
    asyncio.run(take("b"))  # a bucket per key
    now[0] = 1.0  # one token back a second
    asyncio.run(take())


def test_token_bucket_refills_up_to_its_capacity():
    bucket = TokenBucket(rate_per_s=2.0, capacity=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0] * 3
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0] * 3 and bucket.take(100.0) > 0
