"""settle_heap: start-up's garbage is collected and what is left leaves the collector's scans; garbage made later is
still collected."""

import gc
import weakref

from rpc.heap import settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_start_up_garbage_is_collected_the_rest_frozen_and_later_cycles_still_collected():
    before = _cycle()  # garbage of "start-up": a cycle nothing refers to
    try:
        settle_heap()
        assert before() is None  # collected, not frozen
        assert gc.get_freeze_count() > 0
        later = _cycle()
        gc.collect()
        assert later() is None
    finally:
        gc.unfreeze()
