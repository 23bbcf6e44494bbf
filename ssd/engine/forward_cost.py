"""What a decode-shaped forward costs by its number of tokens, from the engine's own timings.

The mode chooser reads it to predict a verify it has not run at a batch size yet: a verify of B sequences and K draft
tokens is one forward of B x (K + 1) tokens. The engine records its plain decode steps (B tokens) and its verify
forwards (B x (K + 1) at the batch sizes it speculated at); prefill forwards are left out, since one long prompt
costs less per token than as many tokens spread over many sequences. Measurements are kept per power-of-two size of
the token count as moving averages of (tokens, seconds), and read off a straight line fitted to them (least
squares; its slope never below zero), so a verify larger than any forward measured is extrapolated. The slope, what
one more token costs, also stands in for the cost of a draft's catch-up until a switch has measured it. Prompt
forwards are averaged on their own: what the target's prefill takes per token bounds what a draft's catch-up (a
smaller model's prefill-shaped forward) can take per token.
"""

from dataclasses import dataclass, field


@dataclass
class ForwardCost:
    smoothing: float = 0.25  # weight of the newest measurement in each size's moving average
    points: dict[int, tuple[float, float]] = field(default_factory=dict)  # size -> (mean tokens, mean seconds)
    prefill: tuple[float, float] | None = None  # (mean tokens, mean seconds) of prompt forwards

    def record_prefill(self, num_tokens: int, seconds: float) -> None:
        """One prompt forward (or chunk) of `num_tokens` tokens over the batch took `seconds`."""
        if num_tokens <= 0 or seconds <= 0:
            return
        old, w = self.prefill, self.smoothing
        self.prefill = (num_tokens, seconds) if old is None else (
            (1 - w) * old[0] + w * num_tokens, (1 - w) * old[1] + w * seconds)

    def prefill_seconds_per_token(self) -> float | None:
        """What the target's prompt forwards took per token; None before one was measured."""
        return None if self.prefill is None else self.prefill[1] / self.prefill[0]

    def record(self, num_tokens: int, seconds: float) -> None:
        """One decode-shaped forward of `num_tokens` tokens (over the whole batch) took `seconds`."""
        if num_tokens <= 0 or seconds <= 0:
            return
        size = max(0, num_tokens - 1).bit_length()
        old = self.points.get(size)
        if old is None:
            self.points[size] = (float(num_tokens), seconds)
            return
        w = self.smoothing
        self.points[size] = ((1 - w) * old[0] + w * num_tokens, (1 - w) * old[1] + w * seconds)

    def seconds(self, num_tokens: int) -> float | None:
        """The predicted seconds of a forward of `num_tokens` tokens; None before two sizes were measured."""
        line = self._line()
        if line is None:
            return None
        mx, my, slope = line
        return max(my + slope * (num_tokens - mx), min(s for _, s in self.points.values()))

    def seconds_per_token(self) -> float | None:
        """The line's slope: what one more token adds to a forward; None before two sizes were measured."""
        line = self._line()
        return None if line is None else line[2]

    def _line(self) -> tuple[float, float, float] | None:
        """(mean tokens, mean seconds, slope) of the least-squares line through the sizes' averages."""
        if len(self.points) < 2:
            return None
        xs, ys = zip(*self.points.values(), strict=True)
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mx) ** 2 for x in xs)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread) if spread else 0.0
        return mx, my, slope
