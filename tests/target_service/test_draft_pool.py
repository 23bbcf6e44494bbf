"""DraftPool: least-loaded placement over healthy sessions, moves off a dead one, background reconnects."""

import threading

import pytest

from target_service.draft_pool import DraftPool
from tests.integration.helpers import wait_for


class FakeSession:
    """Stands in for a DraftSession: the pool reads only `is_broken` and calls `close`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.is_broken = False

    def close(self) -> None:
        self.is_broken = True


class Opener:
    """Opens a FakeSession per call for the addresses that are `up`; counts the opens."""

    def __init__(self, up: set[str]) -> None:
        self.up = set(up)
        self.opened: list[FakeSession] = []
        self.lock = threading.Lock()

    def __call__(self, address: str) -> FakeSession | None:
        with self.lock:
            if address not in self.up:
                return None
            session = FakeSession(address)
            self.opened.append(session)
            return session


@pytest.fixture
def pool_of():
    pools = []

    def make(addresses: list[str], up: set[str]) -> tuple[DraftPool, Opener]:
        opener = Opener(up)
        pool = DraftPool(addresses, opener, reconnect_interval_s=0.01)
        pools.append(pool)
        return pool, opener

    yield make
    for pool in pools:
        pool.close()


def test_new_sequences_go_to_the_least_loaded_draft(pool_of):
    pool, _ = pool_of(["a", "b"], {"a", "b"})
    assert wait_for(lambda: pool.num_healthy == 2, timeout_s=5)
    homes = [pool.session_for(seq_id).address for seq_id in range(6)]
    assert homes == ["a", "b", "a", "b", "a", "b"]
    assert pool.session_for(0).address == "a"  # a sequence stays where it is
    assert pool.session_of(1).address == "b" and pool.session_of(99) is None  # session_of places nothing
    for seq_id in (0, 2, 4):
        assert pool.release(seq_id).address == "a"
    assert [pool.session_for(seq_id).address for seq_id in (10, 11, 12)] == ["a", "a", "a"]  # a had room
    assert pool.num_sequences("a") == 3 and pool.num_sequences("b") == 3


def test_a_dead_drafts_sequences_move_to_the_healthy_one(pool_of):
    pool, opener = pool_of(["a", "b"], {"a", "b"})
    assert wait_for(lambda: pool.num_healthy == 2, timeout_s=5)
    for seq_id in range(4):
        pool.session_for(seq_id)
    opener.up.discard("a")  # it stays down: no reconnect
    dead = pool.sessions[0]
    dead.close()  # the stream broke
    assert pool.session_of(0) is None  # its home is down, and asking does not move it
    assert [pool.session_for(seq_id).address for seq_id in range(4)] == ["b"] * 4
    assert pool.num_sequences("a") == 0 and pool.num_sequences("b") == 4
    assert pool.release(0).address == "b"
    assert pool.is_connected and pool.num_healthy == 1


def test_no_healthy_draft_leaves_a_sequence_without_a_home_until_one_is_up(pool_of):
    pool, opener = pool_of(["a", "b"], set())
    assert not wait_for(lambda: pool.is_connected, timeout_s=0.2)
    assert pool.session_for(7) is None and pool.release(7) is None
    opener.up.add("b")
    assert wait_for(lambda: pool.is_connected, timeout_s=5)
    assert pool.session_for(7).address == "b"


def test_a_broken_session_is_reopened_in_the_background(pool_of):
    pool, opener = pool_of(["a"], {"a"})
    assert wait_for(lambda: pool.is_connected, timeout_s=5)
    first = pool.sessions[0]
    assert pool.session_for(1) is first
    first.close()
    assert wait_for(lambda: pool.is_connected and pool.sessions[0] is not first, timeout_s=5)
    assert pool.session_for(1) is pool.sessions[0]  # same draft, a fresh session (it re-sends a Prefill)


def test_close_closes_every_session_and_stops_reopening(pool_of):
    pool, opener = pool_of(["a", "b"], {"a", "b"})
    assert wait_for(lambda: pool.num_healthy == 2, timeout_s=5)
    pool.close()
    assert all(s.is_broken for s in pool.sessions)
    count = len(opener.opened)
    assert not wait_for(lambda: len(opener.opened) > count, timeout_s=0.2)


def test_a_pool_needs_an_address():
    with pytest.raises(ValueError):
        DraftPool([], lambda address: None)
