"""SSD on the draft service: answers from the speculation cache, then the build, in that order on the wire.

A tiny target checkpoint is its own draft model (a perfect draft), so after the first round every
all-accepted outcome's bonus token is the draft's own top guess: the next lookup hits.
"""

import asyncio
import queue
import threading
import time

import grpc
import pytest
from grpc import aio
from structlog.testing import capture_logs

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer
from draft_service.session import Session
from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from ssd.config import SsdConfig
from ssd.speculation.ngram import NgramProposer
from tests.tiny_models import write_tiny_checkpoint

PROMPT = [5, 6, 7, 8, 9, 10, 11]
K = 3


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    write_tiny_checkpoint(folder, "llama", seed=0)
    return folder


@pytest.fixture(scope="module")
def greedy(target) -> list[int]:
    """The target's greedy continuation of PROMPT (what a perfect draft proposes)."""
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    return llm.generate([PROMPT], SamplingParams(max_tokens=3 * K + 3, ignore_eos=True))[0].token_ids


@pytest.fixture
def draft(target):
    # the neural backup: these tests follow what a miss drafts
    return build_service_proposer(DraftServiceConfig(draft_engine(str(target), kv_cache_memory_mb=8),
                                                     ssd=SsdConfig(backup="neural")))


def prefill(seq_id: int, tokens: list[int], ssd: bool = True) -> draft_pb2.Prefill:
    return draft_pb2.Prefill(seq_id=seq_id, token_ids=tokens, ssd=ssd)


def all_accepted(seq_id: int, before: int, speculation: list[int], bonus: int) -> draft_pb2.Outcome:
    return draft_pb2.Outcome(seq_id=seq_id, num_committed_before=before, new_token_ids=[*speculation, bonus],
                             num_accepted=len(speculation), bonus_token=bonus)


def test_first_round_misses_then_the_cache_hits(draft, greedy):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    tokens = [*PROMPT, greedy[0]]
    first = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill(1, tokens)]))
    item = first.speculations.items[0]
    assert list(item.token_ids) == greedy[1 : K + 1] and not item.is_cache_hit
    assert not item.HasField("predicted_hit")  # nothing was built for it yet
    assert first.speculations.HasField("timings") and first.build is not None
    session.build(first.build)
    assert session.last_build_s > 0
    outcome = all_accepted(1, len(tokens), greedy[1 : K + 1], greedy[K + 1])
    second = session.answer(draft_pb2.Round(num_speculative_tokens=K, outcomes=[outcome]), wait_s=0.002)
    item = second.speculations.items[0]
    assert item.is_cache_hit and list(item.token_ids) == greedy[K + 2 : 2 * K + 2]
    assert 0 < item.predicted_hit <= 1
    timings = second.speculations.timings
    assert timings.last_build_ms > 0 and timings.build_wait_ms == pytest.approx(2.0)
    assert timings.build_fan_out_budget == draft.ssd.config.fan_out_budget  # the first build: nothing fitted yet
    record = session.seqs[1]
    session.release([1])
    assert record.is_released and not session.seqs  # a build still queued for it skips it
    assert record.seq_id not in draft.proposer.seqs  # its model state is freed too


def test_plain_and_ssd_sequences_share_a_round(draft, greedy):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    tokens = [*PROMPT, greedy[0]]
    out = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[
        prefill(1, tokens, ssd=False), prefill(2, tokens)]))
    assert [i.seq_id for i in out.speculations.items] == [1, 2]
    assert [list(i.token_ids) for i in out.speculations.items] == [greedy[1 : K + 1]] * 2
    assert [p.request.seq_id for p in out.build.pending] == [session.seqs[2].seq_id]  # only ssd builds


def test_an_sd_round_drafts_afresh_builds_nothing_and_the_next_ssd_round_misses(draft, greedy):
    """Round.sd_round_seq_ids (the target's mode auto chose SD): the cache that would hit is passed over, the answer
    is the draft's own speculation without a cache-hit flag, and no cache is built for it."""
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    tokens = [*PROMPT, greedy[0]]
    first = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill(1, tokens)]))
    session.build(first.build)
    outcome = all_accepted(1, len(tokens), greedy[1 : K + 1], greedy[K + 1])
    sd = session.answer(draft_pb2.Round(num_speculative_tokens=K, outcomes=[outcome], sd_round_seq_ids=[1]))
    item = sd.speculations.items[0]
    assert list(item.token_ids) == greedy[K + 2 : 2 * K + 2]  # what the cache held, drafted afresh
    assert not item.is_cache_hit and not item.HasField("predicted_hit")
    assert sd.build is not None and sd.build.pending == []
    assert draft.ssd.counters.num_hits + draft.ssd.counters.num_misses == 1  # the SD round was no lookup
    after = all_accepted(1, len(tokens) + K + 1, greedy[K + 2 : 2 * K + 2], greedy[2 * K + 2])
    third = session.answer(draft_pb2.Round(num_speculative_tokens=K, outcomes=[after]))
    assert not third.speculations.items[0].is_cache_hit  # nothing was built: a backup
    assert [p.request.seq_id for p in third.build.pending] == [session.seqs[1].seq_id]  # SSD again: it builds


def test_bad_ssd_options_are_a_sequence_error_and_the_session_goes_on(draft, greedy):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    tokens = [*PROMPT, greedy[0]]
    bad = draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill(1, tokens), prefill(2, tokens, ssd=False)],
                          ssd=draft_pb2.SsdOptions(saguaro_c=2.0))
    out = session.answer(bad).speculations
    assert [(e.seq_id, e.code) for e in out.errors] == [(1, "INVALID_ARGUMENT")]
    assert "Saguaro" in out.errors[0].message
    assert [i.seq_id for i in out.items] == [2]  # the plain SD sequence is answered
    good = draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill(1, tokens)],
                           ssd=draft_pb2.SsdOptions(fan_out_budget=3, fan_out="uniform", saguaro_c=0.5))
    result = session.answer(good)
    assert not result.speculations.errors and result.build.config.fan_out_budget == 3
    assert result.build.config.fan_out == "uniform" and result.build.config.backup == draft.ssd.config.backup


def test_a_failed_build_is_logged_and_the_next_lookup_misses(draft, greedy, monkeypatch):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    tokens = [*PROMPT, greedy[0]]
    first = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill(1, tokens)]))

    def broken(job):  # noqa: ANN001, ANN202
        raise RuntimeError("out of draft KV")

    monkeypatch.setattr(draft.ssd, "build", broken)
    with capture_logs() as logs:
        session.build(first.build)
    assert any("build failed" in e["event"] and e["log_level"] == "error" for e in logs)
    monkeypatch.undo()
    outcome = all_accepted(1, len(tokens), greedy[1 : K + 1], greedy[K + 1])
    second = session.answer(draft_pb2.Round(num_speculative_tokens=K, outcomes=[outcome]))
    item = second.speculations.items[0]
    assert not item.is_cache_hit and list(item.token_ids) == greedy[K + 2 : 2 * K + 2]  # a neural backup


def test_an_ngram_draft_serves_ssd_as_plain_sd_and_says_so_once():
    session = Session(NgramProposer(), "test")
    with capture_logs() as logs:
        out = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[
            prefill(1, [1, 2, 3, 1, 2]), prefill(2, [4, 5, 4])])).speculations
    assert [list(i.token_ids) for i in out.items] == [[3, 1, 2], [5, 4]]
    assert not out.HasField("timings") and not any(i.is_cache_hit for i in out.items)
    assert sum("plain SD" in e["event"] for e in logs) == 1


def test_a_catch_up_brings_the_draft_up_and_the_next_round_answers_from_there(draft, greedy):
    """Plain steps on the target: a catch_up Prefills the sequence and commits plain tokens, answering nothing; the
    draft's KV then holds all but the newest token, and a round whose Outcome brings no new token answers from
    there (a miss: nothing was built), proposing the greedy continuation."""
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    tokens = [*PROMPT, greedy[0]]
    session.catch_up(draft_pb2.Round(prefills=[prefill(1, tokens)]))
    record = session.seqs[1]
    assert draft.proposer.seqs[record.seq_id].num_cached_tokens == len(tokens) - 1
    plain = draft_pb2.Outcome(seq_id=1, num_committed_before=len(tokens), new_token_ids=greedy[1:3], num_accepted=-1)
    session.catch_up(draft_pb2.Round(outcomes=[plain]))
    committed = [*tokens, *greedy[1:3]]
    assert record.token_ids == committed
    assert draft.proposer.seqs[record.seq_id].num_cached_tokens == len(committed) - 1
    nothing_new = draft_pb2.Outcome(seq_id=1, num_committed_before=len(committed), num_accepted=-1)
    answer = session.answer(draft_pb2.Round(num_speculative_tokens=K, outcomes=[nothing_new]))
    item = answer.speculations.items[0]
    assert not item.is_cache_hit and list(item.token_ids) == greedy[3 : 3 + K]
    assert not answer.speculations.errors


def test_a_catch_up_for_an_unknown_sequence_is_logged_and_the_session_goes_on(draft):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    stray = draft_pb2.Outcome(seq_id=9, num_committed_before=3, new_token_ids=[5], num_accepted=-1)
    with capture_logs() as logs:
        session.catch_up(draft_pb2.Round(outcomes=[stray], prefills=[prefill(2, PROMPT)]))
    assert [(e["seq_id"], e["code"]) for e in logs if e["event"] == "catch-up refused a sequence"] == [(9, "NOT_FOUND")]
    assert list(session.seqs) == [2]


@pytest.fixture
def server(draft):
    """A SpeculatorServicer on a real grpc.aio server, in a thread of its own."""
    state: dict = {}
    started = threading.Event()

    async def serve() -> None:
        servicer = SpeculatorServicer(draft, "tiny")
        server = aio.server()
        draft_pb2_grpc.add_SpeculatorServicer_to_server(servicer, server)
        stop = asyncio.Event()
        state.update(port=server.add_insecure_port("127.0.0.1:0"), stop=stop, loop=asyncio.get_running_loop(),
                     servicer=servicer)
        await server.start()
        started.set()
        await stop.wait()
        await server.stop(0)
        await servicer.close()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert started.wait(30)
    yield state
    state["loop"].call_soon_threadsafe(state["stop"].set)
    thread.join(10)


def test_the_answer_is_on_the_wire_before_the_build_runs(server, draft, greedy, monkeypatch):
    """The build blocks until the client has the answer: were the answer sent after the build, it would stall."""
    events: list[str] = []
    released = threading.Event()
    build = draft.ssd.build

    def gated_build(job):  # noqa: ANN001, ANN202
        events.append("build started")
        events.append("released" if released.wait(20) else "build waited in vain")
        build(job)
        events.append("build done")

    monkeypatch.setattr(draft.ssd, "build", gated_build)
    requests: queue.SimpleQueue = queue.SimpleQueue()
    with grpc.insecure_channel(f"127.0.0.1:{server['port']}") as channel:
        info = draft_pb2_grpc.SpeculatorStub(channel).GetInfo(draft_pb2.DraftInfoRequest(), timeout=10)
        assert info.has_ssd
        answers = draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests.get, None), timeout=60)
        requests.put(draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="t", vocab_size=96)))
        assert next(answers).HasField("ready")
        tokens = [*PROMPT, greedy[0]]
        requests.put(draft_pb2.SessionRequest(round_id=2, round=draft_pb2.Round(
            num_speculative_tokens=K, prefills=[prefill(1, tokens)])))
        first = next(answers)
        events.append("answer received")
        time.sleep(0.1)  # the build has had time to start (it must be blocked, not done)
        assert "build done" not in events
        released.set()
        outcome = all_accepted(1, len(tokens), list(first.speculations.items[0].token_ids), greedy[K + 1])
        requests.put(draft_pb2.SessionRequest(round_id=3, round=draft_pb2.Round(
            num_speculative_tokens=K, outcomes=[outcome])))
        second = next(answers)
        requests.put(None)
    assert "build waited in vain" not in events  # released by the client, which had the answer
    assert events.index("answer received") < events.index("released") < events.index("build done")
    item = second.speculations.items[0]
    assert second.round_id == 3 and item.is_cache_hit  # the next round queued behind the build and saw its cache
    assert second.speculations.timings.last_build_ms > 0


def test_ssd_flags_build_the_default_config(monkeypatch):
    from draft_service.config import parse_args
    from ssd.config import SsdConfig

    monkeypatch.setenv("SSD_DRAFT_BACKUP", "fast")
    config = parse_args(["--fan-out-budget", "3", "--fan-out", "uniform", "--saguaro-c", "0.5",
                         "--backup-max-neural-batch", "2"])
    assert config.ssd == SsdConfig(fan_out_budget=3, fan_out="uniform", backup="fast", backup_max_neural_batch=2,
                                   saguaro_c=0.5)
    assert parse_args([]).ssd.fan_out_budget == 8
    assert parse_args([]).ssd.fit_fan_out and not parse_args(["--fixed-fan-out"]).ssd.fit_fan_out
    monkeypatch.setenv("SSD_DRAFT_FIT_FAN_OUT", "0")  # a switch from the environment
    assert not parse_args([]).ssd.fit_fan_out
    with pytest.raises(SystemExit):
        parse_args(["--saguaro-c", "2"])


def test_a_catch_up_on_the_wire_gets_no_answer_and_the_next_round_sees_it(server, greedy):
    requests: queue.SimpleQueue = queue.SimpleQueue()
    with grpc.insecure_channel(f"127.0.0.1:{server['port']}") as channel:
        answers = draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests.get, None), timeout=60)
        requests.put(draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="t", vocab_size=96)))
        assert next(answers).HasField("ready")
        tokens = [*PROMPT, greedy[0]]
        requests.put(draft_pb2.SessionRequest(catch_up=draft_pb2.Round(prefills=[prefill(1, tokens)])))
        requests.put(draft_pb2.SessionRequest(round_id=2, round=draft_pb2.Round(num_speculative_tokens=K, outcomes=[
            draft_pb2.Outcome(seq_id=1, num_committed_before=len(tokens), num_accepted=-1)])))
        answer = next(answers)  # the round's: the catch-up was answered with nothing
        requests.put(None)
    assert answer.round_id == 2 and not answer.speculations.errors
    assert list(answer.speculations.items[0].token_ids) == greedy[1 : K + 1]
    servicer = server["servicer"]
    assert (servicer.num_catch_ups, servicer.num_catch_up_tokens) == (1, len(tokens))


def test_a_catch_up_with_a_round_id_is_acknowledged_once_it_has_run(server, draft, greedy):
    """A draft says in its Ready that it acknowledges catch-ups; one sent with a round id is answered by a CaughtUp
    with that id once the draft holds its tokens (the target waits for it before speculating on new prompts)."""
    requests: queue.SimpleQueue = queue.SimpleQueue()
    tokens = [*PROMPT, greedy[0]]
    with grpc.insecure_channel(f"127.0.0.1:{server['port']}") as channel:
        answers = draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests.get, None), timeout=60)
        requests.put(draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="t", vocab_size=96)))
        assert next(answers).ready.acknowledges_catch_ups
        requests.put(draft_pb2.SessionRequest(round_id=5, catch_up=draft_pb2.Round(prefills=[prefill(1, tokens)])))
        ack = next(answers)
        assert ack.round_id == 5 and ack.HasField("caught_up")
        (session,) = server["servicer"].sessions.values()
        assert draft.proposer.seqs[session.seqs[1].seq_id].num_cached_tokens == len(tokens) - 1
        requests.put(draft_pb2.SessionRequest(round_id=6, round=draft_pb2.Round(num_speculative_tokens=K, outcomes=[
            draft_pb2.Outcome(seq_id=1, num_committed_before=len(tokens), num_accepted=-1)])))
        answer = next(answers)
        requests.put(None)
    assert answer.round_id == 6 and list(answer.speculations.items[0].token_ids) == greedy[1 : K + 1]
