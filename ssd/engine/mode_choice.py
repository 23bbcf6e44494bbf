"""Never slower than plain decoding: per batch size, speculate or not, whichever the engine measured faster.

The engine times every decode step it takes (a speculative round or a plain step) and counts the tokens it
committed. Per batch-size bucket (1, 2, 3-4, 5-8, ...) the chooser keeps a moving average of tokens per second for
each choice, takes the faster one, and probes the other now and then (a choice's speed drifts with the acceptance
of the text and the load). Only sequences whose mode is adaptive follow it; a request that names its mode keeps it.
Output stays exact either way: speculation is lossless, so a switch changes when tokens come, not which.
"""

from dataclasses import dataclass, field

SPECULATE, PLAIN = "speculate", "plain"


def bucket_of(batch_size: int) -> int:
    """The power of two at or above `batch_size`: batches of similar size share their measurements."""
    return 1 << max(0, batch_size - 1).bit_length()


@dataclass
class _Bucket:
    tok_s: dict[str, float] = field(default_factory=dict)  # choice -> moving average of tokens per second
    rounds_since_probe: int = 0


@dataclass
class ModeChooser:
    probe_every: int = 32  # rounds of the better choice between two probes of the other
    smoothing: float = 0.25  # weight of the newest measurement in the moving average
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    num_rounds: dict[str, int] = field(default_factory=lambda: {SPECULATE: 0, PLAIN: 0})
    num_switches: int = 0
    last: str | None = None

    def choose(self, batch_size: int) -> str:
        """SPECULATE or PLAIN for a decode batch of this size: an unmeasured choice first, then the faster one,
        and the slower one again every `probe_every` rounds."""
        b = self.buckets.setdefault(bucket_of(batch_size), _Bucket())
        untried = [c for c in (SPECULATE, PLAIN) if c not in b.tok_s]
        if untried:
            return untried[0]
        best = max(b.tok_s, key=b.tok_s.__getitem__)
        if b.rounds_since_probe >= self.probe_every:
            return PLAIN if best == SPECULATE else SPECULATE
        return best

    def record(self, batch_size: int, choice: str, seconds: float, num_tokens: int) -> None:
        """One decode step of `choice` took `seconds` and committed `num_tokens` tokens over the batch."""
        if seconds <= 0 or num_tokens <= 0:
            return
        b = self.buckets.setdefault(bucket_of(batch_size), _Bucket())
        best_before = max(b.tok_s, key=b.tok_s.__getitem__) if b.tok_s else choice
        rate = num_tokens / seconds
        old = b.tok_s.get(choice)
        b.tok_s[choice] = rate if old is None else (1 - self.smoothing) * old + self.smoothing * rate
        b.rounds_since_probe = b.rounds_since_probe + 1 if choice == best_before else 0  # a probe restarts the count
        self.num_rounds[choice] += 1
        self.num_switches += self.last is not None and choice != self.last
        self.last = choice

    def summary(self) -> dict[str, float | int | str | None]:
        """What it chose: rounds of each choice, switches, the last choice, and the measured speeds per bucket."""
        out: dict[str, float | int | str | None] = {
            "adaptive_speculated_rounds": self.num_rounds[SPECULATE],
            "adaptive_plain_rounds": self.num_rounds[PLAIN], "adaptive_switches": self.num_switches,
            "adaptive_last_choice": self.last}
        for size, b in sorted(self.buckets.items()):
            for choice, rate in b.tok_s.items():
                out[f"adaptive_tok_s_batch{size}_{choice}"] = rate
        return out
