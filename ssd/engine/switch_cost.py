"""What a switch to speculating costs the mode chooser: a fixed part, and a part per token the draft has not seen.

The first round after a switch takes longer than the choice's steady rounds. Its draft first catches up on the
tokens it has not seen (one forward over them: a cost per token), and an SSD draft answers with no cache built for
it (a cost that does not grow with those tokens, like a round trip that finds the draft idle). The chooser measures
each switch's excess over the steady round and fits excess = fixed + per_token x unseen to a bucket's recent
switches (least squares, neither part below zero).

Switches that caught up on about the same number of tokens cannot tell the two parts apart, and reading all of a
1-token switch's excess as a cost per token prices a later 100-token catch-up a hundred times over (on Sapphire
Rapids, 7.5 ms a token kept SSD out for ~1100 steps, docs/benchmarks.md 2026-12-07). So the part per token is never
above what the target's prefill takes per token, where the engine measured one: a draft is smaller than its target
and catches up in one prefill-shaped forward. The rest of the excess is fixed. With no such bound the whole excess of
a lone switch is read per token, the dearer reading of a longer catch-up.
"""

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class SwitchCost:
    """A bucket's last switches to one choice, and the line fitted to them."""

    samples: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=8))  # (unseen tokens, excess s)
    fixed_s: float = 0.0  # seconds every switch costs
    per_token_s: float = 0.0  # seconds each unseen token adds

    @property
    def known(self) -> bool:
        return bool(self.samples)

    @property
    def reads_tokens(self) -> bool:
        """Whether some switch had tokens to catch up on (else the part per token is unmeasured, not zero)."""
        return any(unseen for unseen, _ in self.samples)

    def learn(self, unseen: int, excess_s: float, per_token_cap: float | None = None) -> None:
        """One switch caught up on `unseen` tokens (0: a draft kept up during plain steps) and took `excess_s` more than
        steady rounds; the part per token is at most `per_token_cap` where one is known."""
        self.samples.append((unseen, max(0.0, excess_s)))
        self._fit(math.inf if per_token_cap is None else per_token_cap)

    def seconds(self, unseen: int) -> float:
        """The predicted cost of a switch whose draft has `unseen` tokens to catch up on."""
        return self.fixed_s + self.per_token_s * unseen

    def _fit(self, cap: float) -> None:
        """Least squares through the samples; where their tokens are all alike (or the line would start below
        zero), through zero instead. Then the slope kept within [0, cap], and the fixed part what is left on
        average."""
        us, es = zip(*self.samples, strict=True)
        mu, me = sum(us) / len(us), sum(es) / len(es)
        if not any(us):  # drafts that kept up: nothing to read per token
            self.per_token_s, self.fixed_s = 0.0, me
            return
        spread = sum((u - mu) ** 2 for u in us)
        slope = sum((u - mu) * (e - me) for u, e in zip(us, es, strict=True)) / spread if spread else math.inf
        if slope > me / mu:  # alike tokens, or a line that would start below zero
            slope = sum(u * e for u, e in zip(us, es, strict=True)) / sum(u * u for u in us)
        self.per_token_s = min(max(0.0, slope), cap)
        self.fixed_s = max(0.0, me - self.per_token_s * mu)
