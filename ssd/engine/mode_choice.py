"""Never slower than the alternative: per batch size, speculate (SSD with its overlap), speculate as plain SD, or
decode plainly, whichever the engine measured fastest.

The engine times every decode step it takes and counts the tokens it committed. Per batch-size bucket (1, 2, 3-4,
5-8, ...) the chooser keeps each choice's speed: its mean tokens per step over its last `token_window` sequence-
steps among the bucket's last `token_horizon` (a step of B sequences counts B; a speculative round's yield varies
far more from round to round than its time, and a streak of poor rounds that made the chooser leave a choice must
age out before its probes) over the median seconds of its last `window` steady steps; SSD and SD rounds share one
yield (they draft alike, and measured apart at different times the text's drift would decide between them). It takes
the fastest and probes the others now and then (a choice's speed drifts with the text and the load). The first step
after a switch pays for the switch (a draft that sat out plain steps first catches up on every token it skipped,
unless it was fed them meanwhile; an SSD draft has no cache to answer from and answers from its backup), so a probe
runs up to `probe_steps` steps (fewer where its first rounds already leave it out of reach of the best) and only the
later ones count as its speed, in time and in tokens; the first one counts only
until a later one is measured (so a choice's first try runs to its second step at least, before another untried
choice is tried). A probe of a slower choice costs time: its steady rounds' excess over what their tokens take at
the best speed, and its switch: a fixed part and its draft's catch-up on the tokens it has not seen, fitted to the
bucket's earlier switches (SwitchCost; until one is measured there, the dearest of other buckets' figures and what
one more token adds to the target's forward; a plain probe's switch is the way back).
Probes may take about `explore` of the decode time, shared among the slower choices: a choice is probed again once
the steps since it last ran, at the best choice's time per step, come to its probe's expected cost (at the speeds
measured) over its share. So a probe that would lose little returns after `min_gap` steps, one whose draft has a
long way to catch up far later, and any at the latest after `max_gap` steps. A probe ends after its first steady
step where that leaves it out of reach of the best (its mean tokens per step plus two standard errors). An SSD
batch weighs two slower choices (SD and plain steps); when each had its own 3%, and one within reach was probed
every `min_gap` steps whatever it cost, probes took 6% and more of the decode time (docs/benchmarks.md 2026-12-07).
SD rounds yield what SSD's do, so SD whose rounds take clearly longer than SSD's is not probed at all: it is the
slower whatever the text, and only its time, which the text does not move, could change that.

Leaving speculation for plain steps is not weighed like the other way. A round yields at least one token a
sequence, so where a round costs little more than a plain step (a verify of K + 1 tokens costs what a plain step
does on AMX tiles) speculation at its worst loses that little, while plain steps on text that turned easy again lose
all that speculation would bring until the next probe (at batch 1 on MT-Bench, auto took 274 plain steps of 1383
and ran 6% under SSD, docs/benchmarks.md 2026-12-07). So where speculation at its worst (a token a sequence a round)
is within `downside` of plain's speed, it goes on, once running, while its tokens per step could still reach plain's
speed (the probes' test: their mean plus two standard errors), and gives way only once they clearly cannot; and
while it leads, plain steps, once measured over a few steady steps, are not probed (their yield is exact, and their
speed matters only once speculation's yield falls, where their last measured speed is the bar; probing them cost ~80
plain steps and as many switches back per 1000 rounds at batch 1, with the exploration budget going to them). Where
a round costs far more than a plain step (large batches), the faster choice is taken as measured and every slower
one probed.

What speculation yields is a property of the text, so a batch of up to 4 sequences with half of them new since it
last looked (at batch 1, every new request) re-measures it: its yield starts again from the bucket's yield over all
texts so far, it is probed at once where plain steps lead but would lose at that yield, and its first rounds settle
as after a switch.

An untried bucket takes a plain step first. Before it pays for its first speculative round, the chooser predicts
one: the verify of B sequences with K draft tokens is a forward of B x (K + 1) tokens, whose cost it reads off a
line through the engine's decode steps and verifies of other sizes (ForwardCost), and the round's yield is the
tokens per sequence that speculation gave at the nearest other batch size. The prediction leaves the drafting out,
so it is optimistic in that; but the line can overprice a verify (on AMX tiles a forward costs about the same up to
16 rows per sequence's worth, and the line through 1 and 5 tokens priced a 20-token verify 15% over its measured
time). Where it loses to plain steps by more than `predict_margin`, the bucket starts from it and probes for real
when the budget allows; otherwise speculation is tried.

The choices: SPECULATE, each sequence in its own mode (an SSD sequence's draft builds its next answer while the
target verifies); SD, only offered when an adaptive sequence runs SSD: such sequences speculate as plain SD this
round (the draft drafts now and builds nothing, for when the build slows the verify more than its hits save); PLAIN,
a plain decode step. Only sequences whose mode is adaptive follow the chooser; a request that names its mode keeps
it. Output stays exact either way: speculation is lossless, so a switch changes when tokens come, not which.
"""

import math
import statistics
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from ssd.engine.forward_cost import ForwardCost
from ssd.engine.switch_cost import SwitchCost

SPECULATE, SD, PLAIN = "speculate", "sd", "plain"
CHOICES = (SPECULATE, SD, PLAIN)
SPECULATE_OR_PLAIN = (SPECULATE, PLAIN)


def bucket_of(batch_size: int) -> int:
    """The power of two at or above `batch_size`: batches of similar size share their measurements."""
    return 1 << max(0, batch_size - 1).bit_length()


@dataclass
class _Speed:
    """A choice's speed in a bucket: the mean tokens of its last steps (each step's yield per sequence times the
    bucket's size, so a batch that drained as requests finished compares with a full one) over the median
    seconds of its last steady steps (a switch's settling steps left out of the seconds). The tokens of a
    speculative round vary far more from round to round than its time, so they are averaged over more steps.
    Until a steady step is measured, a prediction or a switch's step stands in (`provisional`)."""

    seconds: deque[float]  # of its last steady steps
    tokens: deque[tuple[int, float]]  # (the bucket's step count, tokens at a full bucket) of its last steps
    provisional: tuple[float, float] | None = None  # (tokens per second, seconds per step) standing in

    @property
    def tok_s(self) -> float:
        if not self.seconds:
            return self.provisional[0] if self.provisional else 0.0
        return self.mean_tokens / self.step_s

    @property
    def mean_tokens(self) -> float:
        return sum(n for _, n in self.tokens) / len(self.tokens)

    @property
    def step_s(self) -> float:
        """The median of its steady steps' seconds: a step the machine stalled (another process, a page fault)
        does not make a choice look slow."""
        if not self.seconds:
            return self.provisional[1] if self.provisional else 0.0
        return statistics.median(self.seconds)

    def add(self, step: int, tokens: float, seconds: float, steady: bool, counts: bool = True) -> None:
        """One step of this choice (the bucket's `step`-th) committed `tokens` in `seconds`; a switch's settling
        step stands in for the time only while no steady step is known, and its tokens count toward the yield only
        where `counts` (or none are known): an SSD round right after a switch answers from the backup (about 1 token
        a sequence), so its tokens, like its time, belong to the switch, not to the choice's yield (counted, they
        made each 4-round probe of SSD look poorer than its steady rounds: 4-5 tokens against 6-13 at batch 4)."""
        if counts or not self.tokens:
            self.tokens.append((step, tokens))
        if steady:
            self.seconds.append(seconds)
            self.provisional = None
        elif not self.seconds and self.provisional is None:
            self.provisional = (tokens / seconds, seconds)

    def age_out(self, now: int, horizon: int, keep: int) -> None:
        """Forget the tokens of steps more than `horizon` bucket steps ago, but for its newest `keep`: a streak of
        poor rounds that made the chooser leave a choice must not outweigh the fresh rounds of its probes."""
        while len(self.tokens) > keep and self.tokens[0][0] < now - horizon:
            self.tokens.popleft()

    def could_reach(self, tok_s: float, batch_size: int) -> bool:
        """Whether its tokens per step measured so far leave it within reach of `tok_s`: their mean plus two
        standard errors, the spread taken as at least half a token per sequence (sqrt(B) / 2) however few steps
        were measured. With no steady step measured yet, the stand-in says."""
        n = len(self.tokens)
        if not n or not self.seconds:
            return self.provisional is None or self.provisional[0] >= tok_s
        mean = self.mean_tokens
        sd = math.sqrt(sum((t - mean) ** 2 for _, t in self.tokens) / (n - 1)) if n > 1 else 0.0
        sd = max(sd, math.sqrt(batch_size) / 2)
        return (mean + 2 * sd / math.sqrt(n)) / self.step_s >= tok_s


@dataclass
class _Bucket:
    speeds: dict[str, _Speed] = field(default_factory=dict)  # choice -> its speed here
    since: dict[str, int] = field(default_factory=dict)  # choice -> steps taken here since it last ran
    run: int = 0  # consecutive steps of the last choice taken here
    steps: int = 0  # decode steps taken here
    switch_costs: dict[str, SwitchCost] = field(default_factory=dict)  # choice -> what a switch to it costs here
    switch: tuple[str, list[float], int] | None = None  # (choice, seconds of its switch steps, unseen tokens)
    last: str | None = None  # the last choice taken here
    members: frozenset[int] = frozenset()  # the sequences of the batch when its text last changed (an epoch began)
    epoch_rounds: int = 0  # speculative steps taken here since then
    spec_tokens: tuple[float, int] = (0.0, 0)  # (sum, count) of every counted speculative step's tokens: all texts


@dataclass
class ModeChooser:
    min_gap: int = 32  # steps of the best choice between two probes of another, at the least
    max_gap: int = 4096  # ... and at the most
    probe_steps: int = 4  # steps a probe runs (its first pays for the switch)
    predict_margin: float = 0.85  # an untried choice is tried unless its prediction is under this share of plain's
    explore: float = 0.03  # the share of decode time the probes of the slower choices may cost together
    downside: float = 0.15  # speculation that loses at most this at its worst leaves for plain steps only when clear
    sd_margin: float = 0.1  # SD whose rounds take this much longer than SSD's is not probed (their yield is one)
    window: int = 8  # steady steps a choice's time per step is measured over
    token_window: int = 64  # sequence-steps a choice's tokens per step are measured over (this / B steps of B)
    token_horizon: int = 256  # ... among the bucket's last this many sequence-steps (at least a probe's)
    prior_steps: int = 2  # new text's speculative yield starts as this many steps at the yield of all texts so far
    new_text_most: int = 4  # the largest batch whose new text is re-measured (a larger one averages its texts)
    buckets: dict[tuple[int, tuple[str, ...]], _Bucket] = field(default_factory=dict)  # (bucket, options) -> it
    forward_cost: ForwardCost = field(default_factory=ForwardCost)  # the engine records decode and verify forwards
    yield_per_seq: dict[int, float] = field(default_factory=dict)  # bucket -> speculation's tokens per seq per round
    num_rounds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHOICES, 0))
    num_predicted: int = 0  # buckets that started from a prediction instead of a speculative round
    num_switches: int = 0
    num_draft_waits: int = 0  # plain steps taken while the draft was still prefilling new prompts
    last: str | None = None

    def choose(self, batch_size: int, options: tuple[str, ...] = SPECULATE_OR_PLAIN, lookahead: int = 0,
               unseen: int = 0, seq_ids: Collection[int] | None = None) -> str:
        """One of `options` (PLAIN among them) for a decode batch of this size with lookahead K = `lookahead`, whose
        draft has `unseen` tokens to catch up on: plain first, then each untried choice (or its prediction), then
        the fastest, with probes of the others. `seq_ids`, the batch's sequences where known, tell when its text
        changed (`_new_text`)."""
        b = self._bucket(batch_size, options)
        if seq_ids is not None:
            self._new_text(b, frozenset(seq_ids), options)
        last = b.speeds.get(b.last) if b.last in options and b.last != PLAIN else None
        if last is not None and not last.seconds and b.run < self.probe_steps:
            return b.last  # a first try goes on until a steady step is measured: its switch step alone is no speed
        for choice in (PLAIN, *options):
            if choice not in b.speeds and not self._predict(b, choice, batch_size, lookahead):
                return choice
        best = self._best(b, options)
        top = b.speeds[best].tok_s
        probe = b.speeds[b.last] if b.last != best else None
        settling = b.run <= self._switch_steps(b.last, options)
        reach = probe is not None and probe.could_reach(top, bucket_of(batch_size))
        if probe is not None and b.run < self.probe_steps and (settling or reach):
            return b.last  # a probe goes on past its switch steps, and on unless its steady steps are hopeless
        if best == PLAIN and reach and self._keeps_speculating(b, options, top, batch_size, b.last):
            return b.last  # speculation that costs little at its worst gives way only once it clearly cannot match
        unprobed = PLAIN if self._plain_known(b) and self._keeps_speculating(
            b, options, b.speeds[PLAIN].tok_s, batch_size, best) else None  # plain, while cheap speculation leads
        outpaced = SD if self._sd_outpaced(b) else None  # SD, where SSD's rounds outpace its own
        probed = [c for c in options if c not in (best, unprobed, outpaced)]
        share = self.explore / (len(options) - 1)
        due = [c for c in probed if self._due(b, c, best, batch_size, unseen, share)]
        return max(due, key=lambda c: b.since.get(c, 0)) if due else best

    def wait_for_draft(self) -> str:
        """The choice while the draft is still prefilling prompts it was handed beside the target's plain steps: a
        plain step (a speculative round would wait for the draft; at batch 16 the first one waited 198 ms,
        docs/benchmarks.md 2026-12-07). The engine records it unmeasured (`measured=False`): the draft's prefill on
        the next core slows it, and plain steps measured so made speculation look faster than it was at batch 16
        (auto took 56-83 rounds of SSD at 0.7x plain's speed, docs/benchmarks.md 2026-12-08)."""
        self.num_draft_waits += 1
        return PLAIN

    def record(self, batch_size: int, choice: str, seconds: float, num_tokens: int,
               options: tuple[str, ...] = SPECULATE_OR_PLAIN, unseen: int = 0, measured: bool = True) -> None:
        """One decode step of `choice` took `seconds` and committed `num_tokens` tokens over the batch; one not
        `measured` (taken beside other work) counts as a step of its choice, but its time and tokens are left out
        (where it is the bucket's first of that choice, the choice stays untried: no stand-in speed from it)."""
        if seconds <= 0 or num_tokens <= 0:
            return
        b = self._bucket(batch_size, options)
        prev = b.last
        switched = prev is not None and choice != prev
        b.run = 1 if switched or prev is None else b.run + 1
        b.last = choice
        if measured:
            self._measure(b, batch_size, choice, prev, switched, seconds, num_tokens, options, unseen)
        for c in options:
            b.since[c] = 0 if c == choice else b.since.get(c, 0) + 1
        self.num_rounds[choice] += 1
        self.num_switches += self.last is not None and choice != self.last
        self.last = choice

    def _measure(self, b: _Bucket, batch_size: int, choice: str, prev: str | None, switched: bool, seconds: float,
                 num_tokens: int, options: tuple[str, ...], unseen: int) -> None:
        """Fold a measured step into bucket `b` (`prev`: its choice before this step): the choice's speed and yield,
        and a switch's cost."""
        size = bucket_of(batch_size)
        switch_steps = self._switch_steps(choice, options)
        fresh = choice != PLAIN and b.epoch_rounds < switch_steps and bool(b.members)  # new text: no cache yet
        b.epoch_rounds += choice != PLAIN
        steady = (prev is None or b.run > switch_steps) and not fresh
        full = num_tokens * size / batch_size  # the tokens at a full bucket: a drained batch compares
        self._track_switch(b, choice, seconds, unseen, switched, steady)
        b.steps += 1
        speed = b.speeds.get(choice) or self._add_speed(b, choice, size)
        counts = steady or (self.probe_steps <= switch_steps and not fresh)
        speed.add(b.steps, full, seconds, steady, counts=counts)
        if choice != PLAIN and counts:
            b.spec_tokens = (b.spec_tokens[0] + full, b.spec_tokens[1] + 1)
        for other in b.speeds.values():
            other.age_out(b.steps, max(self.probe_steps, self.token_horizon // size), self.probe_steps)
        self._learn_switch_cost(b, options)
        if choice != PLAIN:
            per_seq = num_tokens / batch_size
            old_yield = self.yield_per_seq.get(size)
            self.yield_per_seq[size] = per_seq if old_yield is None else 0.75 * old_yield + 0.25 * per_seq

    def _new_text(self, b: _Bucket, seq_ids: frozenset[int], options: tuple[str, ...]) -> None:
        """Begin a new epoch of bucket `b` where at least half of its batch (of up to `new_text_most` sequences) is
        new since the last began: speculation's yield is a property of the text, and new sequences bring new text
        (at batch 1, every request). Plain steps yield a token a sequence whatever the text, so only speculation is
        re-measured. Its yield restarts from `prior_steps` steps at the bucket's yield over all texts so far (judged
        with the old text's rounds, a probe of easy new text ended after two rounds); where plain steps lead but
        that yield would beat them, it is probed at once (waiting for the exploration budget kept plain steps on 59
        tokens of a HumanEval prompt that SSD decoded 3x faster, docs/benchmarks.md 2026-12-07); and its first rounds
        settle as after a switch (`record`: nothing is cached for new sequences). A larger batch averages its texts:
        a new one yields about what the last did, and re-measuring it cost 1-3% at batch 16."""
        if len(seq_ids) > self.new_text_most or len(seq_ids - b.members) * 2 < len(seq_ids):
            return
        b.members, b.epoch_rounds = seq_ids, 0
        if not b.spec_tokens[1]:
            return
        typical = b.spec_tokens[0] / b.spec_tokens[1]  # tokens of a speculative step over all texts so far
        tokens = next((speed.tokens for c, speed in b.speeds.items() if c != PLAIN), None)  # SD's and SSD's deque
        if tokens is not None:  # the old text's rounds give way to the typical text's
            tokens.clear()
            tokens.extend([(b.steps, typical)] * self.prior_steps)
        if not all(c in b.speeds for c in options) or self._best(b, options) != PLAIN:
            return
        speculative = max((c for c in options if c != PLAIN), key=lambda c: b.speeds[c].tok_s)
        if typical / b.speeds[speculative].step_s >= b.speeds[PLAIN].tok_s:
            b.since[speculative] = self.max_gap

    @staticmethod
    def _track_switch(b: _Bucket, choice: str, seconds: float, unseen: int, switched: bool, steady: bool) -> None:
        """Keep the seconds of a switch to speculating while it settles, to learn its cost from once it has (a
        switch whose draft kept up during the plain steps, nothing unseen, still answers with no cache)."""
        if switched and choice != PLAIN:
            b.switch = (choice, [seconds], unseen)
        elif not steady and b.switch is not None and b.switch[0] == choice:
            b.switch[1].append(seconds)

    @staticmethod
    def _switch_steps(choice: str | None, options: tuple[str, ...]) -> int:
        """The steps a switch to `choice` takes to settle. SSD's first round answers at once (with no cache) while
        its draft catches up during the verify; a long catch-up then holds up the next round's answer too (at batch
        4, 448 tokens: 26 ms, then 82 ms, against 30 ms a steady round), so SSD's first two rounds are its switch."""
        return 2 if choice == SPECULATE and SD in options else 1

    def _add_speed(self, b: _Bucket, choice: str, size: int,
                   provisional: tuple[float, float] | None = None) -> _Speed:
        """A new choice's speed in bucket `b`. SSD rounds and SD rounds draft with the same draft and K, and what
        they yield depends on the text, which drifts: measured apart, an SD probe on easy text beat SSD's rounds on
        the harder text before it (SD took 231 rounds at 0.72x SSD's speed, docs/benchmarks.md 2026-12-07). So the
        two share one yield, that of the bucket's last speculative rounds of either kind, and differ by their time."""
        sibling = b.speeds.get(SD if choice == SPECULATE else SPECULATE) if choice != PLAIN else None
        rounds = max(self.probe_steps, self.token_window // size)  # a batch's round averages its sequences
        tokens = sibling.tokens if sibling is not None else deque(maxlen=rounds)
        b.speeds[choice] = _Speed(deque(maxlen=self.window), tokens, provisional)
        return b.speeds[choice]

    def _bucket(self, batch_size: int, options: tuple[str, ...]) -> _Bucket:
        return self.buckets.setdefault((bucket_of(batch_size), options), _Bucket())

    @staticmethod
    def _best(b: _Bucket, options: tuple[str, ...]) -> str:
        return max(options, key=lambda c: b.speeds[c].tok_s)

    def _learn_switch_cost(self, b: _Bucket, options: tuple[str, ...]) -> None:
        """Once the switched-to choice's steady time is known: what its switch steps took beyond it, for the tokens
        the draft had to catch up on (per token at most what the target's prefill takes). Their tokens are not
        charged: a round's yield varies too much to read one switch's shortfall from it (~1 token a sequence
        after an SSD switch, against 1.3-2 steady, is left out of the yield and of the cost alike)."""
        if b.switch is None or not b.speeds[b.switch[0]].seconds:
            return
        choice, seconds, unseen = b.switch
        if b.last == choice and b.run <= self._switch_steps(choice, options):
            return  # still settling
        excess = sum(s - b.speeds[choice].step_s for s in seconds)
        cost = b.switch_costs.setdefault(choice, SwitchCost())
        cost.learn(unseen, excess, self.forward_cost.prefill_seconds_per_token())
        b.switch = None

    def _switch_s(self, b: _Bucket, choice: str, unseen: int) -> float:
        """What a switch to `choice` costs in bucket `b` with `unseen` tokens to catch up on: as its own switches
        there measured it (an SSD round after a switch also answers with no cache, an SD round does not); until
        then (or while none of them had tokens to catch up on and this one has) the dearest known figure, that of
        other switches or what one more token adds to the target's forward (a catch-up's shape changes with the
        batch, so another bucket's figure may fall short)."""
        own = b.switch_costs.get(choice)
        if own is not None and (not unseen or own.reads_tokens):
            return own.seconds(unseen)
        known = [cost.seconds(unseen) for o in self.buckets.values() for cost in o.switch_costs.values()]
        return max([*known, (self.forward_cost.seconds_per_token() or 0.0) * unseen])

    def _due(self, b: _Bucket, choice: str, best: str, batch_size: int, unseen: int, share: float) -> bool:
        """Whether `choice` is probed now: once the time since it last ran, at `best`'s pace, pays its probe's
        expected cost over its `share` of the exploration (its steady rounds' excess at the speeds measured, and its
        switch), but not before `min_gap` steps and at the latest after `max_gap`."""
        since = b.since.get(choice, 0)
        if since < self.min_gap:
            return False
        if since >= self.max_gap:
            return True
        slow, fast = b.speeds[choice], b.speeds[best]
        steady = (self.probe_steps - 1) * slow.step_s * max(0.0, 1.0 - slow.tok_s / fast.tok_s)
        switch = self._switch_s(b, choice, unseen) if choice != PLAIN else self._switch_s(
            b, best, batch_size * self.probe_steps)  # plain: the way back after it
        return since * share * fast.step_s >= steady + switch

    def _sd_outpaced(self, b: _Bucket) -> bool:
        """Whether SD's rounds, measured, take clearly longer than SSD's (by `sd_margin`). The two share one yield, so
        such SD is the slower whatever the text, and probing it buys nothing (at batch 1, SD's probes took 16-33 rounds
        of ~39 ms where SSD's take 27.5, docs/benchmarks.md 2026-12-07). SSD's time is measured whenever it runs or is
        probed, so SD comes back into the probes if SSD's rounds grow as slow; SD's own time (the draft's K steps on
        the round's path) does not follow the text."""
        sd, ssd = b.speeds.get(SD), b.speeds.get(SPECULATE)
        return (sd is not None and ssd is not None and bool(sd.seconds) and bool(ssd.seconds)
                and sd.step_s > (1 + self.sd_margin) * ssd.step_s)

    def _plain_known(self, b: _Bucket) -> bool:
        """Whether plain steps' time is measured well enough to stop probing them: over `probe_steps` steady steps
        (a bucket's first plain step, right after a prefill, can take twice a later one)."""
        return len(b.speeds[PLAIN].seconds) >= self.probe_steps

    def _keeps_speculating(self, b: _Bucket, options: tuple[str, ...], plain_tok_s: float, batch_size: int,
                           choice: str | None) -> bool:
        """Whether `choice` is the faster way to speculate and, at its worst (a token a sequence a round, at its
        measured time per round), within `downside` of plain steps' speed."""
        speculative = [c for c in options if c != PLAIN]
        if choice != self._best(b, tuple(speculative)) or not b.speeds[choice].seconds:
            return False
        return bucket_of(batch_size) / b.speeds[choice].step_s >= (1 - self.downside) * plain_tok_s

    def _predict(self, b: _Bucket, choice: str, batch_size: int, lookahead: int) -> bool:
        """Whether `choice`, untried here, starts from a prediction that loses clearly to the plain steps measured
        here (then it waits for its probe); False: it must be tried (no prediction, or one that could win)."""
        if choice == PLAIN or lookahead < 1 or PLAIN not in b.speeds:
            return False
        size = bucket_of(batch_size)
        measured = [s for s in self.yield_per_seq if s != size]
        seconds = self.forward_cost.seconds(batch_size * (lookahead + 1))
        if not measured or seconds is None:
            return False
        nearest = min(measured, key=lambda s: abs(math.log2(s / size)))
        rate = size * self.yield_per_seq[nearest] / seconds  # drafting left out: an optimistic speed
        if rate >= self.predict_margin * b.speeds[PLAIN].tok_s:
            return False
        self._add_speed(b, choice, size, (rate, seconds))
        b.since[choice] = 0
        self.num_predicted += 1
        return True

    def summary(self) -> dict[str, float | int | str | None]:
        """What it chose: steps of each choice, switches, predictions, the last choice, and the speeds per bucket."""
        out: dict[str, float | int | str | None] = {
            "adaptive_speculated_rounds": self.num_rounds[SPECULATE], "adaptive_sd_rounds": self.num_rounds[SD],
            "adaptive_plain_rounds": self.num_rounds[PLAIN], "adaptive_switches": self.num_switches,
            "adaptive_predicted_buckets": self.num_predicted, "adaptive_draft_waits": self.num_draft_waits,
            "adaptive_last_choice": self.last}
        for (size, _), b in sorted(self.buckets.items()):
            for choice, speed in b.speeds.items():
                out[f"adaptive_tok_s_batch{size}_{choice}"] = speed.tok_s
        return out
