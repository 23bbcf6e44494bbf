"""The SSD overlap as a library component: the speculator on a thread of its own.

`answer` runs on the worker and returns at once (a cache hit or the backup); the worker then goes straight on to
`build`, the next speculation cache, while the caller verifies on its own thread. Every call into the speculator
(answer, build, observe, release) runs on that one worker thread, in the order it was made, so the speculator,
which is not thread-safe, never sees two at once, and an answer always finds the cache of the build before it.
The draft service and in-process SSD (`ssd generate --mode ssd`, `LLM`) both use it.
"""

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import structlog
import torch

from ssd.config import DecodeMode
from ssd.speculation.draft_record import DraftRecord
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.speculation import Speculation
from ssd.speculation.ssd_speculator import BuildJob, SsdSpeculator

log = structlog.get_logger(__name__)


class SpeculatorWorker:
    """One thread for a speculator's calls; records when each cache build ran (perf_counter seconds)."""

    def __init__(self, name: str = "speculator") -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.build_windows: deque[tuple[float, float]] = deque(maxlen=256)  # (start, end) of recent builds
        self.num_failed_builds = 0

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the worker after everything queued before it, and wait for its result."""
        return self.executor.submit(_no_grad, fn, *args).result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue `fn(*args)` on the worker; do not wait."""
        return self.executor.submit(_no_grad, fn, *args)

    def submit_build(self, build: Callable[[BuildJob], None], job: BuildJob) -> Future:
        """Queue a cache build. A failure is logged, never raised: the next lookups of those sequences miss."""
        return self.executor.submit(self._timed_build, build, job)

    def _timed_build(self, build: Callable[[BuildJob], None], job: BuildJob) -> None:
        started = time.perf_counter()
        try:
            _no_grad(build, job)
        except Exception:
            self.num_failed_builds += 1
            log.exception("SSD cache build failed; the next lookups of these sequences miss")
        finally:
            self.build_windows.append((started, time.perf_counter()))

    def close(self) -> None:
        self.executor.shutdown(wait=True)


def _no_grad(fn: Callable[..., Any], *args: Any) -> Any:
    with torch.inference_mode():  # a mode of the calling thread: the worker sets its own
        return fn(*args)


def draft_generator(target: torch.Generator) -> torch.Generator:
    """The draft's own random stream for a sequence, seeded from the target's seed (never drawing from it): the
    draft samples on the worker while the target verifies, and two threads on one stream would make a seeded
    request's output depend on their timing."""
    return torch.Generator().manual_seed((target.initial_seed() * 0x9E3779B97F4A7C15 + 1) % 2**63)


class OverlappedSpeculator:
    """The Proposer protocol over an SsdSpeculator on a SpeculatorWorker: `propose` answers and returns while the
    worker builds the next cache, overlapping the caller's verify forward. It owns the sequences' DraftRecords
    (the dict on the caller's thread; what is in them on the worker's)."""

    feeds_in_background = True  # `catch_up` queues the draft's work on the worker and returns

    def __init__(self, speculator: SsdSpeculator, worker: SpeculatorWorker | None = None) -> None:
        self.speculator = speculator
        self.worker = worker or SpeculatorWorker()
        self.feature_layers = speculator.feature_layers
        self.records: dict[int, DraftRecord] = {}  # seq id -> the draft's record of it
        self._prompt_catch_ups: list[Future] = []  # queued catch-ups that bring the draft new sequences' prompts

    @property
    def counters(self):  # noqa: ANN201 - SsdCounters
        return self.speculator.counters

    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]:
        # The caller's token lists keep growing while the worker builds: the speculator gets a snapshot, and the
        # record's own random stream and grammar matcher (the caller's go on being used on the caller's thread).
        records = [self._record(r) for r in requests]
        own = [replace(r, token_ids=rec.token_ids, generator=rec.generator,
                       grammar=rec.answer_grammar() if r.grammar is not None else None)
               for r, rec in zip(requests, records, strict=True)]
        specs, job = self.worker.call(self._answer, own, records, time.perf_counter())
        self.worker.submit_build(self.speculator.build, job)
        return specs

    def _answer(self, requests: list[ProposeRequest], records: list[DraftRecord],
                asked_at: float) -> tuple[list[Speculation], BuildJob]:
        """The speculator's answer (on the worker), told how long it queued there behind the previous build."""
        return self.speculator.answer(requests, records, waited_s=time.perf_counter() - asked_at)

    def _record(self, r: ProposeRequest) -> DraftRecord:
        """The sequence's record (made at its first propose), its tokens now a snapshot of the request's (a new
        list: the one a queued build reads never changes), with its own grammar matcher once the request has one."""
        record = self.records.get(r.seq_id)
        if record is None:
            record = self.records[r.seq_id] = DraftRecord(r.seq_id, [], r.temperature, draft_generator(r.generator),
                                                           mode=DecodeMode.SSD)
        record.token_ids = list(r.token_ids)
        if r.grammar is not None:
            record.grammar = record.grammar or r.grammar.state.copy()
            record.answer_start = len(r.token_ids) - len(r.grammar.output_ids)
        return record

    def catch_up(self, requests: list[ProposeRequest]) -> None:
        """The draft catches up on the sequences' committed tokens on the worker (after any queued build), while
        the caller goes on; their next answers are backups (nothing was built for a plain step)."""
        new = any(r.seq_id not in self.records for r in requests)
        own = [replace(r, token_ids=self._record(r).token_ids, grammar=None) for r in requests]
        future = self.worker.submit(self.speculator.neural.catch_up, own)
        if new:
            self._prompt_catch_ups.append(future)

    @property
    def catching_up(self) -> bool:
        """Whether the worker is still prefilling new sequences' prompts handed to it by `catch_up`."""
        self._prompt_catch_ups = [f for f in self._prompt_catch_ups if not f.done()]
        return bool(self._prompt_catch_ups)

    def observe(self, seq_id: int, outcome: RoundOutcome) -> None:
        record = self.records.get(seq_id)
        if record is not None:
            self.worker.submit(record.observe, outcome)
        self.worker.submit(self.speculator.neural.observe, seq_id, outcome)

    def release(self, seq_id: int) -> None:
        record = self.records.pop(seq_id, None)
        if record is not None:
            self.worker.submit(self.speculator.release, record)

    def close(self) -> None:
        self.worker.close()
