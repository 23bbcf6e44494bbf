"""What a switch to speculating costs: a fixed part and a part per unseen token, fitted to measured switches."""

import pytest

from ssd.engine.switch_cost import SwitchCost


def test_switches_of_different_lengths_separate_the_fixed_part_from_the_part_per_token():
    cost = SwitchCost()
    for unseen in (2, 100, 4, 50):
        cost.learn(unseen, 0.0075 + 0.0001 * unseen)
    assert (cost.fixed_s, cost.per_token_s) == pytest.approx((0.0075, 0.0001))
    assert cost.seconds(1000) == pytest.approx(0.1075)


def test_a_lone_switch_is_read_per_token_up_to_the_targets_prefill_cost_and_the_rest_is_fixed():
    unbounded, bounded = SwitchCost(), SwitchCost()
    unbounded.learn(2, 0.0075)
    bounded.learn(2, 0.0075, per_token_cap=0.0004)
    assert (unbounded.fixed_s, unbounded.per_token_s) == pytest.approx((0.0, 0.00375))  # the dearer reading
    assert (bounded.fixed_s, bounded.per_token_s) == pytest.approx((0.0067, 0.0004))
    assert bounded.seconds(100) == pytest.approx(0.0467)  # not 100 x 3.75 ms


def test_neither_part_goes_below_zero():
    falling, steep = SwitchCost(), SwitchCost()
    for unseen, excess in ((2, 0.009), (100, 0.007)):  # noise: the longer catch-up measured cheaper
        falling.learn(unseen, excess)
    assert falling.per_token_s == 0.0 and falling.fixed_s == pytest.approx(0.008)
    for unseen, excess in ((10, 0.0), (20, 0.002)):  # a line that would start below zero
        steep.learn(unseen, excess)
    assert steep.fixed_s == 0.0 and steep.per_token_s == pytest.approx(0.04 / 500)
    cost = SwitchCost()
    cost.learn(5, -0.003)  # a switch round faster than the steady median
    assert cost.seconds(50) == 0.0


def test_switches_with_nothing_to_catch_up_on_are_all_fixed_cost():
    cost = SwitchCost()
    for excess in (0.006, 0.008):
        cost.learn(0, excess)
    assert (cost.fixed_s, cost.per_token_s) == pytest.approx((0.007, 0.0))
    assert cost.seconds(0) == pytest.approx(0.007) and not cost.reads_tokens
