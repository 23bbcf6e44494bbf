"""The target's per-sequence deadlines, read when a sequence's Prefill goes to the draft."""

from target_service.seq_deadlines import SeqDeadlines


def test_time_left_counts_down_to_zero_and_clears():
    d = SeqDeadlines()
    assert d.time_left_ms(1) is None  # no deadline: the Prefill leaves time_left_ms unset
    d.set(1, 10.0)
    assert d.time_left_ms(1, now=9.25) == 750
    assert d.time_left_ms(1, now=11.0) == 0  # passed: the draft refuses the Prefill at once
    d.clear(1)
    assert d.time_left_ms(1) is None and len(d) == 0
