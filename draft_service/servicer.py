"""The Speculator servicer: sessions over one bidi stream each; it translates messages, nothing more.

Proposer work (model forwards) runs on the speculator's worker thread (ssd/speculation/speculator_worker.py),
so the event loop keeps serving and the proposer, which is not thread-safe, sees one call at a time across all
sessions. SSD: a round's answer comes back from the worker, which queues the cache build right behind it, before
the answer is even sent; the build runs while the answer travels and the target verifies, and the session's next
round queues behind it and sees its cache. A `catch_up` message (the target took plain steps) is applied like a round
and runs the draft over the committed tokens on the worker; it is answered (CaughtUp) once run where the target asked
for that with a round id, and with nothing where not.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import structlog
from grpc import aio

from draft_service.deadlines import SWEEP_INTERVAL_S, SessionDeadlines
from draft_service.limits import SessionLimits, check_ssd_options
from draft_service.proposers import ServiceDraft
from draft_service.round_screen import screen
from draft_service.session import RoundResult, Session
from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from ssd.speculation.speculation_stats import SpecStats
from ssd.speculation.speculator_worker import SpeculatorWorker

log = structlog.get_logger(__name__)


class SpeculatorServicer(draft_pb2_grpc.SpeculatorServicer):
    def __init__(self, draft: ServiceDraft, draft_name: str, limits: SessionLimits | None = None) -> None:
        self.draft = draft
        self.limits = limits or SessionLimits()  # what a session's peer may ask (draft_service/limits.py)
        self.proposer = draft.proposer
        self.ssd = draft.ssd  # the SsdSpeculator over the same neural draft; None for n-gram
        self.draft_name = draft_name
        self.vocab_size = draft.vocab_size
        self.feature_layers = list(draft.proposer.feature_layers)  # target layers the draft needs features of
        self.sessions: dict[str, Session] = {}
        self.counters = SpecStats()  # rounds and draft tokens proposed (acceptance is the target's)
        self.num_catch_ups = 0  # catch_up messages taken (the targets' plain steps of mode auto)
        self.num_catch_up_tokens = 0  # committed tokens they brought
        self.worker = SpeculatorWorker("proposer")

    async def _in_worker(self, fn, *args):  # noqa: ANN001, ANN202 - thin hop onto the worker thread
        return await asyncio.wrap_future(self.worker.submit(fn, *args))

    def _hello(self, hello: draft_pb2.Hello) -> draft_pb2.SessionResponse | None:
        if self.vocab_size and hello.vocab_size and hello.vocab_size != self.vocab_size:
            return draft_pb2.SessionResponse(error=draft_pb2.Error(
                code="FAILED_PRECONDITION",
                message=f"the draft's vocabulary has {self.vocab_size} tokens, the target's {hello.vocab_size}"))
        return None

    async def Session(self, request_iterator: AsyncIterator[draft_pb2.SessionRequest],
                      context: aio.ServicerContext) -> AsyncIterator[draft_pb2.SessionResponse]:
        key = uuid.uuid4().hex
        session = Session(self.proposer, target_id="unknown", feature_width=self.draft.feature_width, ssd=self.ssd,
                          device=self.draft.device, grammars=self.draft.grammars, vocab_size=self.vocab_size,
                          limits=self.limits)
        self.sessions[key] = session
        context.add_done_callback(lambda _: self._end_session(key))
        bound = log.bind(session=key[:8])
        deadlines = SessionDeadlines()
        sweeper = asyncio.create_task(self._expire(session, deadlines, bound))
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("kind")
                if kind == "hello":
                    session.target_id = msg.hello.target_id
                    bound.info("session opened", target=session.target_id)
                    error = self._hello(msg.hello)
                    if error is not None:
                        yield error
                        continue
                    hello = msg.hello
                    if hello.HasField("ssd"):  # a bad value ends the session (INVALID_ARGUMENT)
                        check_ssd_options(hello.ssd, self.limits)
                        session.set_ssd_options(hello.ssd)
                    session.vocab_size = self.vocab_size or max(0, hello.vocab_size)  # n-gram: the target's
                    transport = session.tensors.accept(
                        list(hello.transports), hello.shm_probe if hello.HasField("shm_probe") else None,
                        hello.cuda_probe if hello.HasField("cuda_probe") else None)
                    bound.info("tensor transport", transport=common_pb2.TensorTransport.Name(transport))
                    yield draft_pb2.SessionResponse(round_id=msg.round_id, ready=draft_pb2.Ready(
                        draft_name=self.draft_name, transport=transport, feature_layers=self.feature_layers,
                        acknowledges_catch_ups=True))
                elif kind == "round":
                    speculations = await self._round(session, deadlines, msg.round)
                    for item in speculations.items:
                        if item.token_ids:  # empty ones (no target features) are no draft
                            self.counters.record(len(item.token_ids), 0, 0)
                    for err in speculations.errors:
                        bound.info("sequence error", seq_id=err.seq_id, code=err.code, error=err.message)
                    yield draft_pb2.SessionResponse(round_id=msg.round_id, speculations=speculations)
                elif kind == "catch_up":
                    await self._catch_up(session, deadlines, msg.catch_up, bound)
                    if msg.round_id:  # the target waits to speculate on new prompts until the draft has them
                        yield draft_pb2.SessionResponse(round_id=msg.round_id, caught_up=draft_pb2.CaughtUp())
                elif kind == "release":
                    for seq_id in msg.release.seq_ids:
                        deadlines.forget(seq_id)
                    await self._in_worker(session.release, list(msg.release.seq_ids))
                else:
                    yield draft_pb2.SessionResponse(round_id=msg.round_id, error=draft_pb2.Error(
                        code="INVALID_ARGUMENT", message="a SessionRequest needs hello, round, catch_up or release"))
        finally:
            sweeper.cancel()
            self._end_session(key)

    async def _round(self, session: Session, deadlines: SessionDeadlines,
                     round_: draft_pb2.Round) -> draft_pb2.Speculations:
        """Screen the round on the event loop (a bad one is refused at once), then answer the rest on the worker."""
        screened = screen(round_, session, deadlines)
        if screened.drop:  # queued ahead of the round: the worker forgets them first
            self.worker.submit(session.release, screened.drop)
        if screened.round is None:
            return draft_pb2.Speculations(errors=screened.errors)
        result = await self._in_worker(_timed_round, session, screened.round, time.perf_counter())
        if result.build is not None:  # build while the answer travels and the target verifies
            self.worker.submit_build(session.build, result.build)
        result.speculations.errors.extend(screened.errors)
        return result.speculations

    async def _catch_up(self, session: Session, deadlines: SessionDeadlines, round_: draft_pb2.Round,
                        bound: structlog.BoundLogger) -> None:
        """Screen a catch_up like a round and run it on the worker (a sequence refused here is forgotten,
        and its next round's Outcome gets NOT_FOUND). Awaited like a round, so the next message is screened
        against the sequences as the catch-up left them."""
        screened = screen(round_, session, deadlines)
        if screened.drop:
            self.worker.submit(session.release, screened.drop)
        for err in screened.errors:
            bound.info("catch-up refused a sequence", seq_id=err.seq_id, code=err.code, error=err.message)
        if screened.round is not None:
            self.num_catch_ups += 1
            self.num_catch_up_tokens += sum(len(p.token_ids) for p in screened.round.prefills) + sum(
                len(o.new_token_ids) for o in screened.round.outcomes)
            await self._in_worker(session.catch_up, screened.round)

    async def _expire(self, session: Session, deadlines: SessionDeadlines, bound: structlog.BoundLogger) -> None:
        """Drop the session's sequences whose deadline passed, whether or not the target sends their Release."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            expired = deadlines.due()
            if expired:
                bound.info("sequences past their deadline dropped", seq_ids=expired)
                self.worker.submit(session.release, expired)

    def _end_session(self, key: str) -> None:
        """Free a session whose stream ended, once: from the RPC's done callback (a cancelled stream's handler
        may never reach its `finally`) or that `finally`. The worker closes it after any round in progress."""
        session = self.sessions.pop(key, None)
        if session is not None:  # else already freed (or close() did)
            self.worker.submit(session.close)
            log.info("session closed", session=key[:8], target=session.target_id)

    async def close(self) -> None:
        """After the server stopped: free every session left (state, shared memory), then the worker."""
        sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            await self._in_worker(session.close)
        self.worker.close()

    async def GetInfo(self, request: draft_pb2.DraftInfoRequest, context: aio.ServicerContext) -> draft_pb2.DraftInfo:
        return draft_pb2.DraftInfo(draft_name=self.draft_name, vocab_size=self.vocab_size,
                                   has_q=self.draft_name != "ngram", feature_layers=self.feature_layers,
                                   has_ssd=self.ssd is not None)

    async def GetLoad(self, request: common_pb2.LoadRequest, context: aio.ServicerContext) -> common_pb2.Load:
        worker = getattr(self.proposer, "worker", None)
        total = used = 0
        if worker is not None:
            total = worker.block_manager.num_blocks
            used = total - worker.block_manager.num_free_blocks
        return common_pb2.Load(
            num_sequences=sum(len(s.seqs) for s in self.sessions.values()),
            num_used_kv_blocks=used, num_kv_blocks=total, num_running=len(self.sessions),
            num_drafts=self.counters.num_drafts, num_draft_tokens=self.counters.num_draft_tokens,
            num_cache_hits=self.ssd.counters.num_hits if self.ssd else 0,
            num_cache_misses=self.ssd.counters.num_misses if self.ssd else 0)


def _timed_round(session: Session, round_: draft_pb2.Round, queued_at: float) -> RoundResult:
    """Answer a round in the worker, telling it how long it waited there (behind the previous build)."""
    return session.answer(round_, wait_s=time.perf_counter() - queued_at)
