"""Fits SSD's fan-out budget to the time the draft has: guesses are worth their build time only while it hides.

SSD hides the draft's work behind the target's verify only while the cache build takes no longer than the window
from its start to the next answer request (the verify plus the answer's round trip). A build that runs over makes
that answer wait, and the whole overrun is added to the round. The build's cost grows with its rows (sequences x
guesses per depth; a few sequences already make a draft's forwards compute-bound on a CPU core), while the hit
rate grows slowly with the guesses, and a hit is worth only what its speculation brings over a backup's.

So, per batch size, the fit keeps the last BUILDS build times of each budget it ran and the last WINDOWS windows,
and chooses the budget, up to the configured one, with the most expected tokens per second of round: tokens(B) /
E[max(window, build(B))], tokens(B) coming from the speculator (its measured hit rate for B guesses and the tokens of
a hit and of a miss). The expectation pairs each recent window with each recent build: builds and windows jitter,
and a budget whose median build just fits the median window still makes about half of its answers wait (the fit of
medians alone ran builds of 28-31 ms against windows of 26-29 at batch 4, and the answer waited 4.1-4.5 ms against
2.9-3.3, docs/benchmarks.md 2026-12-07). A sample past OUTLIER times its median counts as that much: one slow build
(a stall of the machine) must not keep a budget out for good, since a budget the fit no longer chooses is not
measured again, and one long window (plain decode steps chosen by mode auto, a gap between requests) must not hide
the overruns. A budget not run yet is estimated from its measured neighbours (linearly between two, in proportion to
one), with the spread of the nearest one, so the fit tries it and then knows.

A budget the fit left is not measured again while it stays out, so a spell of contention on the draft's core (another
process, the machine's own work) that slowed its builds would keep it out for good, and the budget would sink and stay
low. So the next larger budget whose builds were last measured REFRESH builds ago is run once more, and that build
alone stands for it until the next ones: back in where it fits again (and the next stale one above it is tried at
the next build, so a recovered fit climbs back in a few builds), out for another REFRESH builds where it does not
(one build a little over the window).
"""

import bisect
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

BUILDS = 5  # builds of a budget its time is the median of
REFRESH = 64  # builds of a batch size after which a larger budget left out is measured again
WINDOWS = 9  # windows the median is taken over
MIN_BUDGET = 2  # guesses per sequence and round at least
OUTLIER = 1.5  # a build or window counts as at most this many times its median


@dataclass
class _Measured:
    """One batch size's measurements: the last build seconds of each budget run, and the last windows."""

    builds: dict[int, deque[float]] = field(default_factory=dict)
    windows: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOWS))
    count: int = 0  # builds observed
    last_run: dict[int, int] = field(default_factory=dict)  # budget -> `count` at its last observed build
    refreshing: int | None = None  # a budget run again after REFRESH builds: its next build replaces its times

    def stale(self, chosen: int, most: int) -> int | None:
        """The smallest budget above `chosen`, up to `most`, whose builds were last measured REFRESH builds ago."""
        old = [b for b, at in self.last_run.items() if chosen < b <= most and self.count - at >= REFRESH]
        return min(old, default=None)


@dataclass
class FanOutFit:
    """Per batch size, the fan-out budget the next build uses, from the builds measured so far."""

    measured: dict[int, _Measured] = field(default_factory=dict)

    def observe(self, batch_size: int, budget: int, build_s: float, window_s: float) -> None:
        """A build of `batch_size` sequences at `budget` took build_s; the next answer was asked for window_s after
        it started."""
        if budget <= 0 or build_s <= 0 or window_s <= 0:
            return
        m = self.measured.setdefault(batch_size, _Measured())
        if m.refreshing == budget:
            m.builds.pop(budget, None)
        m.refreshing = None
        m.builds.setdefault(budget, deque(maxlen=BUILDS)).append(build_s)
        m.windows.append(window_s)
        m.count += 1
        m.last_run[budget] = m.count

    def budget(self, batch_size: int, most: int, tokens: Callable[[int], float]) -> int:
        """The budget per sequence for a build of `batch_size` sequences; `most`: the configured budget;
        tokens(B): the tokens a round is expected to bring when the build prepared B guesses per sequence."""
        m = self.measured.get(batch_size)
        if m is None or most <= MIN_BUDGET:
            return most
        windows = _Windows(m.windows)
        medians = {b: statistics.median(times) for b, times in m.builds.items()}
        capped = {b: [min(x, OUTLIER * medians[b]) for x in times] for b, times in m.builds.items()}
        rate = {b: tokens(b) / windows.expected_round(_build_samples(capped, medians, b))
                for b in range(MIN_BUDGET, most + 1)}
        chosen = max(rate, key=lambda b: (round(rate[b], 6), b))  # ties: the larger budget
        m.refreshing = m.stale(chosen, most)
        return chosen if m.refreshing is None else m.refreshing


class _Windows:
    """The recent windows, outliers capped, sorted for E[max(window, build)]."""

    def __init__(self, windows: deque[float]) -> None:
        cap = OUTLIER * statistics.median(windows)
        self.sorted = sorted(min(w, cap) for w in windows)
        self.tail = [0.0] * (len(self.sorted) + 1)  # tail[i] = sum(sorted[i:])
        for i in range(len(self.sorted) - 1, -1, -1):
            self.tail[i] = self.tail[i + 1] + self.sorted[i]

    def expected_round(self, builds: list[float]) -> float:
        """E[max(window, build)] over every pair of a recent window and one of these build times."""
        n = len(self.sorted)
        total = 0.0
        for x in builds:
            shorter = bisect.bisect_right(self.sorted, x)  # windows the build outlasts: the answer waits for it
            total += (x * shorter + self.tail[shorter]) / n
        return total / len(builds)


def _build_samples(capped: dict[int, list[float]], medians: dict[int, float], budget: int) -> list[float]:
    """The build times of `budget` (`capped`: each measured budget's, outliers capped): measured, else its estimate
    with the relative spread of the nearest measured budget."""
    if budget in capped:
        return capped[budget]
    nearest = min(capped, key=lambda b: (abs(b - budget), b))
    scale = _estimate(medians, budget) / medians[nearest]
    return [x * scale for x in capped[nearest]]


def _estimate(builds: dict[int, float], budget: int) -> float:
    """The build time of `budget`: measured, else linear between the nearest measured budgets around it, else in
    proportion to the nearest one."""
    if budget in builds:
        return builds[budget]
    below = max((b for b in builds if b < budget), default=None)
    above = min((b for b in builds if b > budget), default=None)
    if below is not None and above is not None:
        share = (budget - below) / (above - below)
        return builds[below] + share * (builds[above] - builds[below])
    nearest = below if below is not None else above
    return builds[nearest] * budget / nearest  # type: ignore[index]
