"""The fan-out fit (ssd/speculation/fan_out_fit.py): each round's build budget fitted to the time until the next
answer is asked for; and in SSD, the fitted budget is the one the build prepares, with greedy output unchanged."""

from collections.abc import Callable

import pytest

from ssd.config import SsdConfig
from ssd.speculation.fan_out_fit import MIN_BUDGET, REFRESH, FanOutFit
from tests.speculation.test_sd_greedy import PARAMS, PROMPTS
from tests.speculation.test_ssd_inprocess import _llm, models  # noqa: F401 - the module fixture

MOST = 8
TOKENS = lambda b: 1.5 + 0.05 * b  # noqa: E731 - tokens per round: more guesses, more hits, slowly


def _best(build_ms, window_ms: float, tokens=TOKENS) -> int:  # noqa: ANN001
    """The budget with the most tokens per second of round, knowing every build time."""
    rates = {b: tokens(b) / max(window_ms, build_ms(b)) for b in range(MIN_BUDGET, MOST + 1)}
    return max(rates, key=rates.get)


def _settle(fit: FanOutFit, build_ms, window_ms: float, batch: int = 4, rounds: int = 20,  # noqa: ANN001
            tokens=TOKENS) -> list[int]:  # noqa: ANN001
    """Run `rounds` rounds of a draft whose build of budget B takes build_ms(B); the budgets it chose."""
    chosen = []
    for _ in range(rounds):
        budget = fit.budget(batch, MOST, tokens)
        chosen.append(budget)
        fit.observe(batch, budget, build_ms(budget) / 1e3, window_ms / 1e3)
    return chosen


def test_an_overrunning_build_settles_on_the_budget_with_the_most_tokens_per_second():
    build = lambda b: 10 + 5 * b  # noqa: E731 - ms: the glue, then 5 ms per guess
    chosen = _settle(FanOutFit(), build, window_ms=40)
    assert chosen[0] == MOST  # nothing measured yet: the configured budget
    assert MIN_BUDGET < _best(build, 40) < MOST
    assert chosen[-5:] == [_best(build, 40)] * 5


def test_hits_worth_no_more_than_misses_shrink_an_overrunning_build_to_the_least():
    chosen = _settle(FanOutFit(), lambda b: 10 + 5 * b, window_ms=20, tokens=lambda b: 1.8)
    assert chosen[-5:] == [MIN_BUDGET] * 5


def test_a_build_that_fits_keeps_the_configured_budget():
    assert _settle(FanOutFit(), lambda b: 2 * b, window_ms=40) == [MOST] * 20


def test_a_build_of_mostly_fixed_cost_goes_back_to_the_configured_budget():
    """No budget fits and a smaller one saves almost nothing: it is tried once, then the hits are kept."""
    chosen = _settle(FanOutFit(), lambda b: 30 + 0.1 * b, window_ms=10)
    assert min(chosen) >= MIN_BUDGET and chosen[-5:] == [MOST] * 5


def test_batch_sizes_are_fitted_apart_and_a_longer_window_lets_the_budget_grow_back():
    fit = FanOutFit()
    build = lambda b: 5 * b  # noqa: E731
    assert _settle(fit, build, window_ms=20, batch=4)[-1] < MOST
    assert fit.budget(1, MOST, TOKENS) == MOST  # another batch size: nothing measured, the configured budget
    assert _settle(fit, build, window_ms=200, batch=4)[-1] == MOST


@pytest.mark.parametrize("most", [0, 1, MIN_BUDGET])
def test_a_budget_at_or_below_the_minimum_is_used_as_configured(most):
    fit = FanOutFit()
    fit.observe(4, 8, 1.0, 0.001)
    assert fit.budget(4, most, TOKENS) == most


class _Scripted(FanOutFit):
    """Chooses budgets from a script and records what SSD told it."""

    def __init__(self, script: list[int]) -> None:
        super().__init__()
        self.script, self.seen = list(script), []

    def budget(self, batch_size: int, most: int, tokens: Callable[[int], float]) -> int:
        return self.script.pop(0) if self.script else most

    def observe(self, batch_size: int, budget: int, build_s: float, window_s: float) -> None:
        self.seen.append((batch_size, budget, build_s, window_s))


def test_ssd_builds_with_the_fitted_budget_and_gives_ar_tokens(models):  # noqa: F811
    llm = _llm(models, "other", SsdConfig())
    speculator = llm.engine.speculative_decoder.proposer.speculator
    script = [2, 5, 3, 8, 2, 2, 7] * 20
    speculator.fan_out_fit = _Scripted(script)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == models[1]  # the budget changed round to round; the tokens did not
    counters, seen = speculator.counters, speculator.fan_out_fit.seen
    assert counters.num_builds > 2 and counters.fan_out_budget_sum == sum(script[: counters.num_builds])
    # every build but the first (its glue fed the prompts: not what a budget costs) and the last (measured at the
    # next answer, which never came) was measured
    assert len(seen) >= counters.num_builds - 2
    assert [budget for _, budget, _, _ in seen] == script[1 : 1 + len(seen)]
    assert all(batch >= 1 and build_s > 0 for batch, _, build_s, _ in seen)
    # the window: from a build's start to the next answer request (<= 0 when asked before the worker began it)
    assert any(window_s > 0 for _, _, _, window_s in seen)


def test_fixed_fan_out_prepares_the_configured_budget_every_round(models):  # noqa: F811
    llm = _llm(models, "other", SsdConfig(fan_out_budget=6, fit_fan_out=False))
    speculator = llm.engine.speculative_decoder.proposer.speculator
    speculator.fan_out_fit = _Scripted([2] * 100)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == models[1]
    assert speculator.counters.fan_out_budget_sum == 6 * speculator.counters.num_builds > 0
    assert speculator.fan_out_fit.seen == []


def test_one_slow_build_does_not_keep_a_budget_out():
    """A budget's build time is the median of its last builds: one stall of the machine (a build 3x as long) does
    not price the configured budget out of a window it fits, for good (a budget no longer chosen is not measured
    again)."""
    fit = FanOutFit()
    build = lambda b: 2 + 2 * b  # noqa: E731 - ms: every budget fits the 25 ms window
    assert _settle(fit, build, window_ms=25)[-3:] == [MOST] * 3
    fit.observe(4, MOST, 3 * build(MOST) / 1e3, 25 / 1e3)
    assert fit.budget(4, MOST, TOKENS) == MOST


def test_one_long_window_does_not_undo_the_fit():
    """A pause (mode auto's plain steps, a gap between requests) makes one window long: the budget stays fitted."""
    fit = FanOutFit()
    build = lambda b: 10 + 5 * b  # noqa: E731
    settled = _settle(fit, build, window_ms=40)[-1]
    fit.observe(4, settled, build(settled) / 1e3, 5.0)  # 5 s: the draft sat idle
    assert fit.budget(4, MOST, TOKENS) == settled


def _contended(fit: FanOutFit, build, window_ms: float = 25) -> int:  # noqa: ANN001
    """A spell of contention on the draft's core: every build takes 3x as long until the fit leaves the configured
    budget; returns the budget it left it for."""
    for _ in range(20):
        budget = fit.budget(4, MOST, TOKENS)
        if budget < MOST:
            return budget
        fit.observe(4, budget, 3 * build(budget) / 1e3, window_ms / 1e3)
    raise AssertionError("the fit kept the configured budget through the contention")


def test_a_budget_left_during_contention_is_measured_again_and_taken_back():
    """A budget the fit left is not measured while it stays out: after REFRESH builds it is run once more, and
    where it fits again the fit climbs back to the configured budget."""
    fit = FanOutFit()
    build = lambda b: 2 + 2 * b  # noqa: E731 - ms: every budget fits the 25 ms window on a quiet core
    _settle(fit, build, window_ms=25)
    assert _contended(fit, build) < MOST
    chosen = _settle(fit, build, window_ms=25, rounds=REFRESH + 10)
    assert MOST not in chosen[: REFRESH - 10]  # out until it is measured again
    assert chosen[-5:] == [MOST] * 5


def test_a_budget_that_still_overruns_is_run_once_per_refresh():
    fit = FanOutFit()
    build = lambda b: 10 + 5 * b  # noqa: E731 - ms: budgets above the fitted one overrun the 40 ms window
    best = _best(build, 40)
    tail = _settle(fit, build, window_ms=40, rounds=3 * REFRESH)[-2 * REFRESH:]
    assert tail.count(best) >= len(tail) - 2 * 2  # one step up per refresh, at most two a period


def test_a_budget_whose_jittering_builds_make_answers_wait_gives_way():
    """Builds jitter: budget B's build takes 2.5 B ms times 0.8 / 0.9 / 1.0 / 1.2 / 1.3 in turn, and each window is
    20 ms. The configured budget's median build (20 ms) just fits, yet two answers in five wait 4-6 ms for it. The fit
    prices each window against each build, so it settles on the budget with the most tokens per expected round, a
    smaller one (a fit of medians alone kept the configured budget)."""
    jitter = (0.8, 0.9, 1.0, 1.2, 1.3)

    def expected_round(b: int) -> float:
        return sum(max(20.0, 2.5 * b * f) for f in jitter) / len(jitter)

    tokens = lambda b: 1.6 + 0.01 * b  # noqa: E731 - a guess more adds few hits
    best = max(range(MIN_BUDGET, MOST + 1), key=lambda b: tokens(b) / expected_round(b))
    assert best < MOST
    fit, chosen = FanOutFit(), []
    for i in range(60):
        budget = fit.budget(4, MOST, tokens)
        chosen.append(budget)
        fit.observe(4, budget, 2.5 * budget * jitter[i % len(jitter)] / 1e3, 20 / 1e3)
    assert chosen[0] == MOST and chosen[-10:] == [best] * 10
