"""The draft side of SSD (SSD.md sections 2-5): answer from the speculation cache, then build the next one.

`answer` handles one round for a batch: it reads each sequence's outcome (k accepted, bonus) as the verifier
counted it from the caller's DraftRecord (ssd/speculation/draft_record.py), returns the cached speculation for that
key (a hit) or a backup (a miss: an n-gram lookup by default, or the neural draft now under `backup` neural, or
auto at small batches; only the sequences that missed), and notes in the record what it returned. The speculator
keeps no per-sequence state of its own.
A request marked `sd_round` (mode auto chose plain SD for this round) gets the neural draft's speculation now,
no lookup, and nothing built after it; so does every request of a round whose caches could not pay (below).
`build` then runs, while the target verifies: one glue forward over each returned speculation, forks the
top-F_j bonus guesses at every acceptance length j (never s_{j+1}, which would have been accepted), tree-
decodes all branches K deep (one batched forward per depth), and stores (seq, j, guess) -> K tokens (+ q).
How many guesses a build prepares per sequence (the fan-out budget) is fitted, per batch size, to the time between
its start and the next answer request (ssd/speculation/fan_out_fit.py), up to the configured budget.

The overlap, where the speed comes from, is `speculator_worker.py`: the build runs on the speculator's own thread while the target verifies, in the
draft service and in one process alike.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ssd.config import Backup, SsdConfig
from ssd.sampling.greedy import argmax_rows
from ssd.sampling.sampler import sample_from_each
from ssd.speculation.branch_drafter import BranchDrafter, BranchRequest, GlueRequest
from ssd.speculation.draft_record import CachedSpeculation, DraftRecord
from ssd.speculation.draft_vocab import DraftVocab, target_vocab
from ssd.speculation.fan_out_fit import FanOutFit
from ssd.speculation.fanout import FanOutEstimator, expected_hit_rate, fan_out_shape, spend_spare
from ssd.speculation.ngram import NgramProposer
from ssd.speculation.proposer import Proposer, ProposeRequest
from ssd.speculation.saguaro import SaguaroScale, saguaro_scale
from ssd.speculation.speculation import Speculation

RANKED_GUESSES = 16  # guesses ranked per acceptance length, to measure the miss-rate power law
# With a neural backup one miss makes a whole round wait for the backup, so a round's caches pay only when every
# sequence hits: below SsdConfig.round_hit_floor the round drafts every sequence now, as SD, and builds nothing (a
# build then only takes cores and memory bandwidth from the verify). Every PROBE_EVERY-th such round builds
# anyway, to keep measuring the hit rate.
PROBE_EVERY = 16
HIT_RATE_WEIGHT = 0.05  # of each new answer in the hit rate's moving average


def sample_branch_tokens(logits: torch.Tensor, temperature: torch.Tensor, top: int, c: float,
                         generator: list[tuple[torch.Generator, int]]) -> tuple[list[int], torch.Tensor]:
    """logits [N, Vd] of several requests' branches, temperature [N, 1] per row, generator: (each request's
    generator, its row count) in row order -> one token per row and the q [N, Vd] it was drawn from
    (Saguaro-scaled by c on the top); ids and q in the logits' vocabulary (the drafter's: tokens outside it have
    q = 0 anyway). One softmax and one inverse-CDF draw for all rows; each request draws from its own stream."""
    probs = saguaro_scale(torch.softmax(logits / temperature, dim=-1), top, c)  # [N, Vd]
    generators, sizes = zip(*generator, strict=True)
    return sample_from_each(probs, list(generators), list(sizes)).tolist(), probs


@dataclass
class SsdCounters:
    num_hits: int = 0
    num_misses: int = 0
    num_rounds_drafted_now: int = 0  # rounds whose whole hit was too unlikely: every sequence drafted as SD
    num_neural_backups: int = 0
    num_fast_backups: int = 0
    num_builds: int = 0
    predicted_hits: float = 0.0  # sum of predicted hit probabilities over the rounds that had a prediction
    num_predicted: int = 0
    num_predicted_actual_hits: int = 0  # actual hits over those same rounds
    lookup_s: float = 0.0
    backup_s: float = 0.0
    build_s: float = 0.0
    last_lookup_s: float = 0.0
    last_backup_s: float = 0.0
    last_build_s: float = 0.0
    last_fan_out_budget: int = 0  # guesses per sequence the last build prepared (fitted, or the configured budget)
    fan_out_budget_sum: int = 0  # over the builds


@dataclass
class _Pending:
    request: ProposeRequest
    record: DraftRecord  # the caller's: the build fills its cache
    spec: Speculation
    features_used: bool  # this sequence's backup already consumed the request's features


@dataclass
class BuildJob:
    """What one `answer` returned, to build the caches for (run it before the next `answer` of these sequences)."""

    pending: list[_Pending]
    config: SsdConfig


@dataclass(frozen=True)
class _BuildTime:
    """When the last build ran (perf_counter seconds), over how many sequences, at which budget."""

    started: float
    ended: float
    num_sequences: int
    budget: int
    prefilled: bool  # it glued a sequence's first build (the draft fed its whole prompt)


class SsdSpeculator:
    """Wraps a neural proposer (used for backups) and its branch drafter; one instance per draft. Each call gets
    the sequences' DraftRecords from their owner; `release` frees a sequence's model state."""

    def __init__(self, neural: Proposer, drafter: BranchDrafter, config: SsdConfig, ngram_max: int = 3) -> None:
        self.neural = neural
        self.drafter = drafter
        self.config = config
        self.fast = NgramProposer(max_ngram=ngram_max)
        self.feature_layers = neural.feature_layers
        self.after_hit = FanOutEstimator()  # acceptance of cached speculations
        self.after_miss = FanOutEstimator(prior_a=0.4)  # acceptance of backups
        self.counters = SsdCounters()
        self.hit_rate = 1.0  # moving average over the answers that had a cache to look in (1: none measured yet)
        self._rounds_since_build = 0
        self.fan_out_fit = FanOutFit()
        self.tokens_after_hit: float | None = None  # moving means of a round's tokens after a hit / after a miss
        self.tokens_after_miss: float | None = None
        self._last_build: _BuildTime | None = None

    def release(self, record: DraftRecord) -> None:
        """Free the sequence's model state; a build still queued for it skips it."""
        record.is_released = True
        self.drafter.release(record.seq_id)
        self.neural.release(record.seq_id)

    # -- answering --------------------------------------------------------------------------------
    def _record(self, state: DraftRecord, outcome: tuple[int, int]) -> None:
        j, bonus = outcome
        estimator = self.after_hit if state.last_hit else self.after_miss
        estimator.record_round(len(state.last_speculation), j)
        tokens = j + 1.0  # accepted + the bonus (a backup of no tokens brings 1)
        if state.last_hit:
            self.tokens_after_hit = _moving(self.tokens_after_hit, tokens)
        else:
            self.tokens_after_miss = _moving(self.tokens_after_miss, tokens)
        if j < len(state.guesses):
            guesses = state.guesses[j]
            estimator.record_rank(guesses.index(bonus) if bonus in guesses else None)

    def answer(self, requests: list[ProposeRequest], records: list[DraftRecord],
               config: SsdConfig | None = None, waited_s: float = 0.0) -> tuple[list[Speculation], BuildJob]:
        """One speculation per request (a cache hit, or a backup for the misses) and the build to run next;
        records[i] is requests[i]'s sequence. waited_s: how long the request queued behind the previous build."""
        config = config or self.config
        started = time.perf_counter()
        self._fit_fan_out(started - waited_s, config)
        out: dict[int, Speculation] = {}
        misses: list[tuple[ProposeRequest, DraftRecord]] = []
        sd_now: list[tuple[ProposeRequest, DraftRecord]] = []  # speculated as plain SD this round
        self._measure_hits(records)
        everyone_now = self._drafts_everyone_now(requests, config)
        for r, state in zip(requests, records, strict=True):
            outcome = state.outcome
            if outcome is not None:
                self._record(state, outcome)
            if r.sd_round or everyone_now:
                sd_now.append((r, state))
                continue
            cached = state.cache.get(outcome) if outcome is not None else None
            predicted = state.predicted_hit if outcome is not None else None
            if predicted is not None:
                self.counters.num_predicted += 1
                self.counters.predicted_hits += predicted
                self.counters.num_predicted_actual_hits += cached is not None
            if cached is None:
                misses.append((r, state))
                continue
            n = r.num_tokens
            q = cached.vocab.widen(cached.q[:n], 0.0) if cached.q is not None else None  # [n, V]
            out[r.seq_id] = Speculation(cached.tokens[:n], None, q,
                                        cache_hit=True, predicted_hit=predicted)
        lookup = time.perf_counter() - started
        num_misses, num_answered = len(misses), len(requests) - len(sd_now)
        if misses and config.backup_hits and config.backup_for(len(requests)) is Backup.NEURAL:
            misses = [(r, state) for r, state in zip(requests, records, strict=True) if not r.sd_round]  # hits too
        consumed = self._backup(misses, config, len(requests), out)  # seq ids whose features a backup used
        self._draft_now(sd_now, out)
        self.counters.num_hits += num_answered - num_misses
        self.counters.num_misses += num_misses
        self.counters.last_lookup_s, self.counters.last_backup_s = lookup, time.perf_counter() - started - lookup
        self.counters.lookup_s += lookup
        self.counters.backup_s += self.counters.last_backup_s
        job = BuildJob([], config)
        specs = []
        for r, state in zip(requests, records, strict=True):
            spec = out[r.seq_id]
            state.answered(spec.tokens, bool(spec.cache_hit))
            if not (r.sd_round or everyone_now):
                job.pending.append(_Pending(r, state, spec, r.seq_id in consumed))
            specs.append(spec)
        return specs, job

    def _round_tokens(self, k: int, config: SsdConfig) -> Callable[[int], float]:
        """tokens(B): the tokens a round of k-token speculations is expected to bring when its build prepared B
        guesses per sequence: a miss's, plus the predicted hit rate times what a hit brings over it (the measured
        means of rounds after a hit and after a miss; until both are measured, a hit counts one token more). A hit
        never counts less than a miss: where the backup does better (n-gram copies in code), that says where
        misses happen, not that fewer guesses would bring more."""
        on_hit, on_miss = self.tokens_after_hit, self.tokens_after_miss
        if on_hit is None or on_miss is None:
            on_hit, on_miss = 2.0, 1.0
        gain = max(0.0, on_hit - on_miss)
        laws = [(self.hit_rate, self.after_hit.a, self.after_hit.r), (1 - self.hit_rate, self.after_miss.a,
                                                                       self.after_miss.r)]

        def tokens(budget: int) -> float:
            hit = sum(weight * expected_hit_rate(fan_out_shape(config.fan_out, a, r, k, budget), a, r)
                      for weight, a, r in laws)
            return on_miss + hit * gain

        return tokens

    def _fit_fan_out(self, asked_at: float, config: SsdConfig) -> None:
        """Tell the fit how the last build compared with the time until this answer was asked for."""
        last, self._last_build = self._last_build, None
        if last is not None and config.fit_fan_out and not last.prefilled:  # a prompt's prefill is not the budget's
            self.fan_out_fit.observe(last.num_sequences, last.budget, last.ended - last.started,
                                     asked_at - last.started)

    def _measure_hits(self, records: list[DraftRecord]) -> None:
        """Fold the answers that can hit (a cache was built for the outcome they bring) into the hit rate."""
        for state in records:
            if state.cache and state.outcome is not None:
                self.hit_rate = _moving(self.hit_rate, float(state.outcome in state.cache))

    def _drafts_everyone_now(self, requests: list[ProposeRequest], config: SsdConfig) -> bool:
        """Whether this round drafts every sequence now (as SD) and builds nothing: a neural backup, and a round of
        several sequences that all hit less likely than config.round_hit_floor (but for a probe now and then)."""
        count = sum(not r.sd_round for r in requests)
        if count <= 1 or config.backup_for(len(requests)) is not Backup.NEURAL:
            return False
        if self.hit_rate**count >= config.round_hit_floor or self._rounds_since_build >= PROBE_EVERY:
            self._rounds_since_build = 0
            return False
        self._rounds_since_build += 1
        self.counters.num_rounds_drafted_now += 1
        return True

    def _draft_now(self, sd_now: list[tuple[ProposeRequest, DraftRecord]], out: dict[int, Speculation]) -> None:
        """Plain SD for these sequences: the neural draft's speculation now, not an SSD answer (no cache-hit flag);
        no cache is built for them, so their next SSD answer is a backup."""
        if sd_now:
            for (r, _), spec in zip(sd_now, self.neural.propose([r for r, _ in sd_now]), strict=True):
                out[r.seq_id] = Speculation(spec.tokens, None, spec.q)

    def _backup(self, misses: list[tuple[ProposeRequest, DraftRecord]], config: SsdConfig, batch_size: int,
                out: dict[int, Speculation]) -> set[int]:
        """Speculations for the sequences that missed; returns the ids whose features the backup consumed
        (a neural backup catches the head up on them; the sequences that hit keep theirs for the glue)."""
        if not misses:
            return set()
        kind = config.backup_for(batch_size)
        requests = [r for r, _ in misses]
        if config.saguaro_c < 1.0:  # sample the backup Saguaro-style too, for the miss shape it will be built with
            tops = tuple(f + 1 for f in self.shape(False, max(r.num_tokens for r in requests), config))
            requests = [replace(r, saguaro=SaguaroScale(config.saguaro_c, tops)) for r in requests]
        proposer = self.neural if kind is Backup.NEURAL else self.fast
        if kind is Backup.NEURAL:
            self.counters.num_neural_backups += len(misses)
        else:
            self.counters.num_fast_backups += len(misses)
        for (r, state), spec in zip(misses, proposer.propose(requests), strict=True):
            out[r.seq_id] = Speculation(spec.tokens, None, spec.q, cache_hit=False, predicted_hit=state.predicted_hit)
        return {r.seq_id for r, _ in misses} if kind is Backup.NEURAL else set()

    # -- building ---------------------------------------------------------------------------------
    def shape(self, after_hit: bool, k: int, config: SsdConfig | None = None) -> tuple[int, ...]:
        """The fan-out F_0..F_k for a speculation of k tokens."""
        config = config or self.config
        est = self.after_hit if after_hit else self.after_miss
        return fan_out_shape(config.fan_out, est.a, est.r, k, config.fan_out_budget)

    @torch.inference_mode()
    def build(self, job: BuildJob) -> None:
        """Fill the speculation cache for every speculation an `answer` returned; the fan-out budget: job.config's,
        or fitted to the time the build has (off the answer's path: the target verifies meanwhile)."""
        pending = [p for p in job.pending if not p.record.is_released and p.request.num_tokens > 0]
        if not pending:
            return
        started = time.perf_counter()
        config = job.config
        if config.fit_fan_out:
            k = max(p.request.num_tokens for p in pending)
            budget = self.fan_out_fit.budget(len(pending), config.fan_out_budget, self._round_tokens(k, config))
            config = replace(config, fan_out_budget=budget)
        glue = self.drafter.glue([
            GlueRequest(p.request.seq_id, p.request.token_ids, p.spec.tokens,
                        reserve=p.request.num_tokens * max(1, config.fan_out_budget),
                        features=None if p.features_used else p.request.features,
                        features_start=p.request.features_start)
            for p in pending
        ])
        branches: list[BranchRequest] = []
        owners: list[_Pending] = []
        for p, logits in zip(pending, glue, strict=True):
            request = self._fork(p, logits, config)
            if request.tokens:
                branches.append(request)
                owners.append(p)
        if branches:
            self._decode(branches, owners, config)
        ended = time.perf_counter()
        prefilled = not all(p.record.built for p in pending)
        self._last_build = _BuildTime(started, ended, len(pending), config.fan_out_budget, prefilled)
        for p in pending:
            p.record.built = True
        self.counters.num_builds += 1
        self.counters.last_build_s = ended - started
        self.counters.build_s += self.counters.last_build_s
        self.counters.last_fan_out_budget = config.fan_out_budget
        self.counters.fan_out_budget_sum += config.fan_out_budget

    def _fork(self, p: _Pending, logits: torch.Tensor, config: SsdConfig) -> BranchRequest:
        """Bonus guesses per acceptance length j from the glue's logits [m+1, Vd]; records the ranked guesses."""
        state = p.record
        spec = p.spec.tokens
        shape = self.shape(bool(p.spec.cache_hit), len(spec), config)
        logits, vocab = self._constrained(p.request, logits, [spec[:j] for j in range(len(logits))])
        top = logits.topk(min(RANKED_GUESSES + 1, logits.shape[-1]), dim=-1)  # [m+1, 17]
        estimator = self.after_hit if p.spec.cache_hit else self.after_miss
        a = estimator.a
        for j, (row, values) in enumerate(zip(top.indices.tolist(), top.values.tolist(), strict=True)):
            excluded = spec[j] if j < len(spec) else None
            row = vocab.to_target(row)
            ranked = [t for t, v in zip(row, values, strict=True) if t != excluded and v > float("-inf")]
            state.guesses.append(ranked[:RANKED_GUESSES])
        # P(the round stops at j) under the measured geometric acceptance
        stops = [(1 - a) * a**j if j < len(spec) else a**j for j in range(len(state.guesses))]
        counts = spend_spare(shape, [len(g) for g in state.guesses], stops, estimator.hit_probability)
        fork_points, tokens, predicted = [], [], 0.0
        for j, (ranked, count) in enumerate(zip(state.guesses, counts, strict=True)):
            fork_points.extend([j] * count)
            tokens.extend(ranked[:count])
            predicted += stops[j] * estimator.hit_probability(count)  # x the measured P(bonus among the guesses)
        state.predicted_hit = predicted
        return BranchRequest(p.request.seq_id, len(p.request.token_ids), len(spec) + 1, fork_points, tokens)

    def _constrained(self, request: ProposeRequest, logits: torch.Tensor,
                     paths: list[list[int]]) -> tuple[torch.Tensor, DraftVocab]:
        """logits [n, Vd] in the drafter's vocabulary -> (logits, their vocabulary): unchanged without a grammar;
        under one, widened to the target's and limited to what it allows after each path (a row the trimmed
        vocabulary cannot continue becomes uniform over the allowed target tokens)."""
        if request.grammar is None:
            return logits, self.drafter.vocab
        full = self.drafter.vocab.widen(logits, float("-inf"))  # [n, V]
        return request.grammar.constrain(full, paths), target_vocab(full.shape[-1])

    def _pick_all(self, requests: list[ProposeRequest], logits: list[torch.Tensor], paths: list[list[list[int]]],
                  vocabs: list[DraftVocab], qs: list[list[torch.Tensor]], top: int, c: float) -> list[list[int]]:
        """One depth's next token of every branch (ids in vocabs[i], set here); appends each sampled q to qs[i].
        Greedy requests take the argmax; sampled ones without a grammar draw in one batch, the others alone."""
        tokens: list[list[int]] = [[] for _ in requests]
        batch: list[int] = []
        for i, (r, rows) in enumerate(zip(requests, logits, strict=True)):
            # under a grammar, each branch's path: the speculation up to its fork, its guess, its tokens
            logits[i], vocabs[i] = self._constrained(r, rows, paths[i])
            if r.temperature <= 0:
                tokens[i] = argmax_rows(logits[i]).tolist()
            elif r.grammar is None:
                batch.append(i)
        groups = [batch] if batch else []
        groups += [[i] for i, r in enumerate(requests) if r.temperature > 0 and r.grammar is not None]
        for group in groups:
            sizes = [len(logits[i]) for i in group]
            temps = torch.cat([torch.full((n, 1), requests[i].temperature) for i, n in zip(group, sizes, strict=True)])
            drawn, q = sample_branch_tokens(torch.cat([logits[i] for i in group]), temps, top, c,
                                            [(requests[i].generator, n) for i, n in zip(group, sizes, strict=True)])
            for i, row, qi in zip(group, _split(drawn, sizes), q.split(sizes), strict=True):
                tokens[i] = row
                qs[i].append(qi)
        return tokens

    def _decode(self, branches: list[BranchRequest], owners: list[_Pending], config: SsdConfig) -> None:
        qs: list[list[torch.Tensor]] = [[] for _ in branches]  # [request][depth] -> [M, Vd]
        vocabs = [self.drafter.vocab] * len(branches)  # the vocabulary of each request's q
        depth = max(p.request.num_tokens for p in owners)
        hit_shape = self.shape(True, depth, config)
        paths = [[[*p.spec.tokens[:j], guess] for j, guess in zip(b.fork_points, b.tokens, strict=True)]
                 if p.request.grammar is not None else [] for b, p in zip(branches, owners, strict=True)]

        def pick(d: int, logits: list[torch.Tensor]) -> list[list[int]]:  # logits [M_i, Vd] per request
            top = hit_shape[min(d, len(hit_shape) - 1)] + 1  # the guesses at this depth and s_{d+1} itself
            tokens = self._pick_all([p.request for p in owners], logits, paths, vocabs, qs, top, config.saguaro_c)
            for i, row in enumerate(tokens):
                tokens[i] = vocabs[i].to_target(row)
                for path, token in zip(paths[i], tokens[i], strict=False):  # no paths without a grammar
                    path.append(token)
            return tokens

        results = self.drafter.decode_branches(branches, depth, pick)
        for i, (b, p, tokens) in enumerate(zip(branches, owners, results, strict=True)):
            q = torch.stack(qs[i], dim=1) if qs[i] else None  # [M, depth, Vd]
            for r, (j, guess) in enumerate(zip(b.fork_points, b.tokens, strict=True)):
                p.record.cache[(j, guess)] = CachedSpeculation(tokens[r].tolist(), q[r] if q is not None else None,
                                                               vocabs[i])


def _moving(mean: float | None, value: float) -> float:
    """The moving mean (weight HIT_RATE_WEIGHT per value) after `value`; the first value starts it."""
    return value if mean is None else mean + HIT_RATE_WEIGHT * (value - mean)


def _split(items: list[int], sizes: list[int]) -> list[list[int]]:
    """Consecutive runs of `sizes` items."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [items[a : a + n] for a, n in zip(starts, sizes, strict=True)]
