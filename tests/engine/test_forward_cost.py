"""The mode chooser's forward-cost model: a straight line through the decode-shaped forwards measured so far."""

import pytest

from ssd.engine.forward_cost import ForwardCost


def test_nothing_is_predicted_before_two_sizes_were_measured():
    cost = ForwardCost()
    assert cost.seconds(8) is None and cost.seconds_per_token() is None
    cost.record(4, 0.02)
    cost.record(4, 0.03)  # the same size again: its moving average
    assert cost.seconds(8) is None and cost.points[2] == (4.0, pytest.approx(0.0225))


def test_a_line_through_the_sizes_extrapolates_to_a_larger_verify():
    cost = ForwardCost()
    for tokens, seconds in ((1, 0.020), (5, 0.024), (16, 0.035)):  # 1 ms a token over 20 ms
        cost.record(tokens, seconds)
    assert cost.seconds(80) == pytest.approx(0.099)
    assert cost.seconds(5) == pytest.approx(0.024)
    assert cost.seconds_per_token() == pytest.approx(0.001)  # what the chooser prices an unmeasured catch-up at


def test_the_slope_is_never_negative_and_nothing_is_cheaper_than_the_cheapest_forward():
    cost = ForwardCost()
    cost.record(1, 0.030)
    cost.record(8, 0.020)  # noise: a larger forward measured faster
    assert cost.seconds(64) == pytest.approx(0.025)
    assert cost.seconds(1) >= 0.020


def test_prompt_forwards_give_the_targets_prefill_cost_per_token_apart_from_the_decode_line():
    cost = ForwardCost()
    assert cost.prefill_seconds_per_token() is None
    cost.record_prefill(100, 0.040)
    cost.record_prefill(0, 1.0)  # nothing fed: ignored
    assert cost.prefill_seconds_per_token() == pytest.approx(0.0004)
    assert cost.seconds(5) is None  # the decode line knows nothing of prompts
