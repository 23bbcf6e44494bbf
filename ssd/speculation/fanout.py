"""Fan-out shapes for SSD: how many bonus-token guesses the draft prepares for each acceptance length j.

With per-token acceptance rate a, acceptance lengths are geometric: P(j) = (1-a) a^j for j < K and
P(K) = a^K. If the miss rate at one position falls as a power law in fan-out, 1 - p_hit(F) = F^(-r),
maximizing the expected hit rate sum_j P(j) (1 - F_j^(-r)) under sum_j F_j <= B gives
F_j proportional to P(j)^(1/(1+r)) (SSD.md section 5): F_j = F_0 a^(j/(1+r)) for j < K and
F_K = F_0 a^(K/(1+r)) (1-a)^(-1/(1+r)). `FanOutEstimator` measures a and r online from outcomes.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ssd.config import FanOut
from ssd.errors import InvalidRequestError

MAX_RANK = 64  # bonus-token ranks at or beyond this count as "never in a fan-out"


def _round_to_budget(weights: list[float], budget: int) -> tuple[int, ...]:
    """Integers proportional to `weights` summing to exactly `budget` (largest remainders)."""
    total = sum(weights)
    exact = [budget * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))  # largest remainder first
    for i in order[: budget - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def geometric_fan_out(a: float, r: float, k: int, budget: int) -> tuple[int, ...]:
    """F_0..F_K (K+1 counts) summing to `budget`; non-increasing over j < K; the K term as in SSD.md."""
    if k < 0 or budget < 0:
        raise InvalidRequestError(f"fan-out needs K >= 0 and a budget >= 0, got K={k}, budget={budget}")
    a = min(max(a, 1e-3), 1 - 1e-3)
    r = max(r, 1e-3)
    e = 1.0 / (1.0 + r)
    weights = [a ** (j * e) for j in range(k)] + [a ** (k * e) * (1 - a) ** (-e)]
    return _round_to_budget(weights, budget)


def uniform_fan_out(k: int, budget: int) -> tuple[int, ...]:
    """The same fan-out at every acceptance length (the reference engine's default), budget split evenly."""
    return _round_to_budget([1.0] * (k + 1), budget)


def fan_out_shape(kind: FanOut, a: float, r: float, k: int, budget: int) -> tuple[int, ...]:
    if kind is FanOut.UNIFORM:
        return uniform_fan_out(k, budget)
    return geometric_fan_out(a, r, k, budget)


def spend_spare(shape: tuple[int, ...], available: list[int], weights: list[float],
                hit: Callable[[int], float]) -> list[int]:
    """Guesses to fork per acceptance length j: F_j, but never more than the `available` candidates at j (a
    grammar's forced or narrow positions have fewer than F_j); what is left over goes, one guess at a time, to the
    j where it adds the most hit probability, weights[j] x (hit(c + 1) - hit(c)), weights[j] being P(the round
    stops at j). The total stays within sum(F) (the budget)."""
    counts = [min(f, n) for f, n in zip(shape, available, strict=True)]
    for _ in range(sum(shape) - sum(counts)):
        gains = [(w * (hit(c + 1) - hit(c)), j)
                 for j, (c, n, w) in enumerate(zip(counts, available, weights, strict=True)) if c < n]
        if not gains:
            break
        counts[max(gains)[1]] += 1
    return counts


def expected_hit_rate(shape: tuple[int, ...], a: float, r: float) -> float:
    """sum_j P(j) (1 - F_j^(-r)) under the geometric / power-law model (F_j = 0 never hits)."""
    k = len(shape) - 1
    probs = [(1 - a) * a**j for j in range(k)] + [a**k]
    return sum(p * (1 - f ** (-r)) for p, f in zip(probs, shape, strict=True) if f > 0)


@dataclass
class FanOutEstimator:
    """Online estimates of the acceptance rate a and the power-law exponent r, with priors until data arrives.

    a: maximum-likelihood for geometric acceptance truncated at the speculation length (accepted tokens over
    accepted tokens plus rejections). r: least-squares fit through the origin of log miss(F) = -r log F,
    where miss(F) is the measured fraction of bonus tokens ranked >= F among the draft's guesses.
    """

    prior_a: float = 0.6
    prior_r: float = 0.6
    prior_weight: float = 8.0  # pseudo-rounds the priors count for
    num_accepted: float = 0.0
    num_rejections: float = 0.0
    rank_counts: list[int] = field(default_factory=lambda: [0] * (MAX_RANK + 1))  # [rank], last = >= MAX_RANK

    def record_round(self, num_proposed: int, num_accepted: int) -> None:
        if num_proposed <= 0:
            return
        self.num_accepted += num_accepted
        self.num_rejections += 1 if num_accepted < num_proposed else 0

    def record_rank(self, rank: int | None) -> None:
        """The bonus token's rank among the draft's guesses at its acceptance length (None = not ranked)."""
        self.rank_counts[MAX_RANK if rank is None else min(rank, MAX_RANK)] += 1

    @property
    def a(self) -> float:
        w = self.prior_weight
        accepted = self.num_accepted + w * self.prior_a / (1 - self.prior_a)
        return accepted / (accepted + self.num_rejections + w)

    def hit_probability(self, fan_out: int) -> float:
        """P(the bonus token is among `fan_out` guesses), measured once enough outcomes are in, else the prior law."""
        if fan_out <= 0:
            return 0.0
        total = sum(self.rank_counts)
        if total < 16:
            return 1.0 - fan_out ** (-self.prior_r)
        return sum(self.rank_counts[: min(fan_out, MAX_RANK)]) / total

    @property
    def r(self) -> float:
        total = sum(self.rank_counts)
        if total < 16:
            return self.prior_r
        num = den = 0.0
        below = 0
        for f in range(1, 17):  # miss(F) = P(rank >= F)
            below += self.rank_counts[f - 1]
            miss = max(total - below, 0.5) / total
            x = math.log(f)
            num += x * -math.log(miss)
            den += x * x
        return min(max(num / den, 0.05), 4.0)
