"""Deadlines on the draft: a sequence whose Prefill's time left passed is dropped by the draft itself (its state
freed without a Release) and anything naming it is answered DEADLINE_EXCEEDED."""

import asyncio

import structlog

from draft_service.config import DraftServiceConfig
from draft_service.deadlines import SessionDeadlines
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer
from draft_service.session import Session
from protos.ssd.v1 import draft_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_due_moves_passed_deadlines_to_the_expired_ids():
    clock = Clock()
    d = SessionDeadlines(clock, remembered=2)
    d.start(1, 50)
    d.start(2, 500)
    d.start(3, None)  # no deadline
    assert d.due() == [] and len(d) == 2
    clock.now += 0.05
    assert d.due() == [1] and d.is_expired(1) and not d.is_expired(2)
    assert d.due() == []  # reported once
    d.forget(2)
    clock.now += 10
    assert d.due() == [] and not d.is_expired(2)  # released before its deadline: never expired


def test_a_new_prefill_replaces_the_deadline_and_the_expired_memory_is_bounded():
    clock = Clock()
    d = SessionDeadlines(clock, remembered=2)
    for seq_id in (1, 2, 3):
        d.start(seq_id, 0)
    assert d.due() == [1, 2, 3]
    assert [d.is_expired(i) for i in (1, 2, 3)] == [False, True, True]  # the oldest is forgotten
    d.start(2, None)
    assert not d.is_expired(2)


def _round(*messages) -> draft_pb2.Round:  # noqa: ANN002
    prefills = [m for m in messages if isinstance(m, draft_pb2.Prefill)]
    outcomes = [m for m in messages if isinstance(m, draft_pb2.Outcome)]
    return draft_pb2.Round(num_speculative_tokens=2, prefills=prefills, outcomes=outcomes)


def test_the_draft_drops_an_expired_sequence_without_a_release():
    servicer = SpeculatorServicer(build_service_proposer(DraftServiceConfig()), "ngram")
    session = Session(servicer.proposer, "test", vocab_size=100)
    clock = Clock()
    deadlines = SessionDeadlines(clock)

    async def scenario() -> tuple[draft_pb2.Speculations, draft_pb2.Speculations, list[int]]:
        first = await servicer._round(session, deadlines, _round(
            draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 1, 2], time_left_ms=50),
            draft_pb2.Prefill(seq_id=2, token_ids=[4, 5, 4, 5])))  # no deadline
        clock.now += 0.06
        sweeper = asyncio.create_task(servicer._expire(session, deadlines, structlog.get_logger()))
        await asyncio.sleep(0.3)  # a few sweeps
        sweeper.cancel()
        await servicer._in_worker(lambda: None)  # the release the sweep queued has run
        held = sorted(session.seqs)
        later = await servicer._round(session, deadlines, _round(
            draft_pb2.Outcome(seq_id=1, num_committed_before=5, new_token_ids=[3], num_accepted=-1),
            draft_pb2.Outcome(seq_id=2, num_committed_before=4, new_token_ids=[4], num_accepted=-1)))
        return first, later, held

    try:
        first, later, held = asyncio.run(scenario())
    finally:
        servicer.worker.close()
    assert sorted(i.seq_id for i in first.items) == [1, 2] and not first.errors
    assert held == [2]  # the expired sequence's state is gone, though no Release came
    assert [(e.seq_id, e.code) for e in later.errors] == [(1, "DEADLINE_EXCEEDED")]
    assert [i.seq_id for i in later.items] == [2]


def test_a_prefill_whose_deadline_passed_is_refused_at_once():
    servicer = SpeculatorServicer(build_service_proposer(DraftServiceConfig()), "ngram")
    session = Session(servicer.proposer, "test", vocab_size=100)
    try:
        out = asyncio.run(servicer._round(session, SessionDeadlines(), _round(
            draft_pb2.Prefill(seq_id=7, token_ids=[1, 2], time_left_ms=0))))
    finally:
        servicer.worker.close()
    assert [(e.seq_id, e.code) for e in out.errors] == [(7, "DEADLINE_EXCEEDED")] and not out.items
    assert not session.seqs
