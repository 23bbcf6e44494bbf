"""Runs the engine's step loop in a thread of its own and hands results to the asyncio side.

The event loop never touches the engine: it queues commands (add, abort) and awaits futures;
the engine thread applies them between steps and posts each step's outputs to per-request
asyncio queues with one call_soon_threadsafe per step. Load is published as an immutable snapshot.
"""

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from ssd.engine.llm_engine import LLMEngine, StepOutput
from ssd.errors import EngineDeadError
from ssd.sampling.params import SamplingParams
from ssd.speculation.speculation_stats import SpecStats
from target_service.admission import AdmissionLimits, check_admission

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LoadSnapshot:
    num_waiting: int = 0
    num_running: int = 0
    num_used_kv_blocks: int = 0
    num_kv_blocks: int = 0
    num_outstanding_tokens: int = 0  # max_tokens not yet generated, over admitted requests
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_cache_hits: int = 0  # SSD speculations verified that came from the draft's cache
    num_cache_misses: int = 0  # SSD speculations verified that were backups
    num_prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache at admission, ever
    num_prefix_hit_tokens: int = 0  # of those, tokens whose KV the prefix cache served
    num_preemptions: int = 0
    spec: SpecStats | None = None  # a copy of the engine-wide speculation counters (metrics read it)
    # adaptive requests (SamplingParams.adaptive): decode steps the engine's mode chooser took per choice
    # ("speculate" / "plain"), and how often it switched between them
    adaptive_rounds: dict[str, int] = field(default_factory=dict)
    adaptive_switches: int = 0
    adaptive_draft_waits: int = 0  # plain steps taken while a draft was still prefilling new prompts


class EngineLoop:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop,
                 on_dead: Callable[[], None] = lambda: None, admission: AdmissionLimits | None = None) -> None:
        self.engine = engine
        self.admission = admission  # None = an unbounded queue
        self.loop = loop
        self.on_dead = on_dead  # called on the event loop once the engine cannot step again
        self.streams: dict[int, asyncio.Queue] = {}  # seq id -> queue of StepOutput | Exception
        self._commands: deque[Callable[[], None]] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.load = LoadSnapshot(num_kv_blocks=engine.block_manager.num_blocks)
        self._thread = threading.Thread(target=self._run, daemon=True, name="engine-loop")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    # -- called from the event loop ---------------------------------------------------------
    async def add(self, prompt_token_ids: list[int], params: SamplingParams) -> tuple[int, asyncio.Queue]:
        """Queue a request; raises the engine's typed error if it is invalid."""
        future: asyncio.Future = self.loop.create_future()
        stream: asyncio.Queue = asyncio.Queue()

        def command() -> None:
            try:
                if self.admission is not None:
                    check_admission(self.engine, len(prompt_token_ids), self.admission)
                seq_id = self.engine.add_request(prompt_token_ids, params)
            except Exception as e:  # handed to the caller, who maps it to a status
                self.loop.call_soon_threadsafe(_settle, future, None, e)
                return
            self.streams[seq_id] = stream
            self.loop.call_soon_threadsafe(_settle, future, seq_id, None)

        self._submit(command)
        return await future, stream

    def abort(self, seq_id: int) -> None:
        def command() -> None:
            self.streams.pop(seq_id, None)
            self.engine.abort(seq_id)

        self._submit(command)

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.append(command)
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            while self._commands:
                self._commands.popleft()()
            if not self.engine.has_unfinished():
                self._publish_load()
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except EngineDeadError as e:  # no step can run again: fail everything, let the service exit
                log.error("engine is dead; stopping the service", error=str(e))
                self._fail_all(e)
                self.loop.call_soon_threadsafe(self.on_dead)
                return
            except Exception as e:  # fail the running requests loudly, keep the service up
                log.exception("engine step failed")
                self._fail_all(e)
                continue
            self._publish_load()  # before the outputs: a caller that saw its last token sees its KV freed
            self._dispatch(outputs)

    def _dispatch(self, outputs: list[StepOutput]) -> None:
        ready = []
        for out in outputs:
            stream = self.streams.get(out.seq_id)
            if stream is not None:
                ready.append((stream, out))
            if out.finish_reason is not None:
                self.streams.pop(out.seq_id, None)
        if ready:
            self.loop.call_soon_threadsafe(_deliver, ready)

    def _fail_all(self, error: Exception) -> None:
        ready = [(stream, error) for stream in self.streams.values()]
        for seq_id in list(self.streams):
            self.engine.abort(seq_id)
        self.streams.clear()
        if ready:
            self.loop.call_soon_threadsafe(_deliver, ready)

    def _publish_load(self) -> None:
        e = self.engine
        bm = e.block_manager
        outstanding = sum(max(0, s.params.max_tokens - s.num_output_tokens) for s in e.seqs.values())
        c = e.speculative_decoder.counters if e.speculative_decoder is not None else None
        self.load = LoadSnapshot(
            num_waiting=len(e.scheduler.waiting), num_running=len(e.scheduler.running),
            num_used_kv_blocks=bm.num_blocks - bm.num_free_blocks, num_kv_blocks=bm.num_blocks,
            num_outstanding_tokens=outstanding,
            num_drafts=c.num_drafts if c else 0, num_draft_tokens=c.num_draft_tokens if c else 0,
            num_accepted_tokens=c.num_accepted_tokens if c else 0,
            num_cache_hits=c.num_cache_hits if c else 0, num_cache_misses=c.num_cache_misses if c else 0,
            num_prefix_queried_tokens=e.scheduler.num_prefix_queried_tokens,
            num_prefix_hit_tokens=e.scheduler.num_prefix_hit_tokens, num_preemptions=e.scheduler.num_preemptions,
            spec=c.snapshot() if c else None, adaptive_rounds=dict(e.mode_chooser.num_rounds),
            adaptive_switches=e.mode_chooser.num_switches, adaptive_draft_waits=e.mode_chooser.num_draft_waits)


def _settle(future: asyncio.Future, value: object, error: Exception | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _deliver(ready: list[tuple[asyncio.Queue, object]]) -> None:
    for stream, item in ready:
        stream.put_nowait(item)
