"""Two drafts behind one target: sequences spread over both, and a dead draft's sequences move to the other.

First the target's side alone: a RemoteProposer over two in-process n-gram draft servers (real gRPC, real
SpeculatorServicer), driven by hand. Then real processes (`ssd serve --drafts 2` with the default model and
the shipped EAGLE-3 head): `kill -9` of one draft mid-stream leaves every request completing with the same
greedy text.
"""

import asyncio
import signal
import threading
from collections import Counter

import pytest
import torch

from deploy.local import free_port, stop_stack
from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer
from draft_service.session import Session
from protos.ssd.v1 import draft_pb2_grpc
from rpc.engine_errors import ENGINE_STATUS
from rpc.server import GrpcServer, HostedService
from ssd.model_store import DEFAULT_DRAFT
from ssd.speculation.proposer import ProposeRequest
from target_service.remote_proposer import RemoteProposer, fetch_feature_layers
from tests.integration.conftest import API_KEY, launch
from tests.integration.helpers import draft_load, openai_client, stream_chat, target_load, wait_for
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

K = 3


class DraftServer:
    """A draft service (n-gram unless told) on the test's event loop thread; `stop` ends it as a dying draft would."""

    def __init__(self, loop: asyncio.AbstractEventLoop, draft: str = "ngram", target_model: str | None = None) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        config = DraftServiceConfig(draft_engine(draft), target_model=target_model)
        self.servicer = SpeculatorServicer(build_service_proposer(config), draft)
        self.loop = loop
        self.server = self._run(self._start())
        self.is_stopped = False

    async def _start(self) -> GrpcServer:  # on the loop: a grpc.aio server belongs to the loop it is made on
        service = HostedService("ssd.v1.Speculator", self.servicer, draft_pb2_grpc.add_SpeculatorServicer_to_server)
        server = GrpcServer([service], self.address, ENGINE_STATUS, grace_s=0.1)
        await server.start()
        return server

    def _run(self, coro):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def seq_ids(self) -> set[int]:
        """The sequences this draft holds, over all its sessions."""
        return {seq_id for s in list(self.servicer.sessions.values()) for seq_id in s.seqs}

    def stop(self) -> None:
        if not self.is_stopped:
            self.is_stopped = True
            self._run(self.server.server.stop(0))
            self._run(self.servicer.close())


@pytest.fixture(scope="module")
def loop():
    """One event loop thread for every in-process server (grpc.aio servers of one process share a loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture
def two_drafts(loop):
    servers = [DraftServer(loop), DraftServer(loop)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def rounds(monkeypatch) -> Counter:
    """Rounds each draft-side Session answered."""
    counts: Counter = Counter()
    answer = Session.answer

    def counting(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        counts[id(self)] += 1
        return answer(self, *args, **kwargs)

    monkeypatch.setattr(Session, "answer", counting)
    return counts


def request(seq_id: int, tokens: list[int], start: int = 0, features: torch.Tensor | None = None) -> ProposeRequest:
    return ProposeRequest(seq_id, tokens, K, 0.0, torch.Generator(), None, features, start)


def repeating(seq_id: int, length: int) -> list[int]:
    """A sequence whose tail repeats: n-gram lookup proposes K tokens for it."""
    period = [10 * seq_id + i for i in range(1, 5)]
    return (period * length)[:length]


def test_sequences_spread_over_both_drafts_and_move_off_a_dead_one(two_drafts, rounds):
    a, b = two_drafts
    proposer = RemoteProposer([a.address, b.address], "test", 1000, timeout_s=10, reconnect_interval_s=0.05)
    try:
        assert wait_for(lambda: proposer.pool.num_healthy == 2)
        seqs = {seq_id: repeating(seq_id, 9) for seq_id in range(1, 5)}
        specs = proposer.propose([request(i, t) for i, t in seqs.items()])
        assert all(len(s.tokens) == K for s in specs)
        assert a.seq_ids() == {1, 3} and b.seq_ids() == {2, 4}  # least loaded first: they alternate
        assert sorted(rounds.values()) == [1, 1]  # one Round per draft for the engine's round
        a.stop()  # the draft dies: its stream breaks
        assert wait_for(lambda: proposer.pool.num_healthy == 1)
        seqs = {seq_id: repeating(seq_id, 10) for seq_id in seqs}  # one more token each
        specs = proposer.propose([request(i, t) for i, t in seqs.items()])
        assert b.seq_ids() == {1, 2, 3, 4}  # 1 and 3 were re-sent to b as Prefills
        assert all(len(s.tokens) == K for s in specs)  # and keep speculating there
        assert proposer.pool.num_sequences(b.address) == 4
        for seq_id in seqs:
            proposer.release(seq_id)
        assert wait_for(lambda: not b.seq_ids())  # b was told to free them
    finally:
        proposer.close()


def test_without_any_draft_rounds_get_no_speculation(two_drafts):
    a, b = two_drafts
    proposer = RemoteProposer([a.address, b.address], "test", 1000, timeout_s=10, reconnect_interval_s=0.05)
    try:
        assert wait_for(lambda: proposer.pool.num_healthy == 2)
        a.stop()
        b.stop()
        assert wait_for(lambda: not proposer.is_connected)
        assert proposer.propose([request(1, repeating(1, 9))])[0].tokens == []
    finally:
        proposer.close()


@pytest.fixture
def two_eagle_drafts(loop, tmp_path_factory):
    """Two draft services, each with the same tiny EAGLE-3 head (it drafts from target features)."""
    target, head = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("eagle3")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_head(head, target)
    servers = [DraftServer(loop, str(head), str(target)), DraftServer(loop, str(head), str(target))]
    yield servers
    for server in servers:
        server.stop()


def test_a_moved_sequence_takes_its_target_features_to_the_other_eagle3_draft(two_eagle_drafts):
    """Without its old features the other draft could not draft it (test_eagle_reconnect: a reconnect to a
    single draft drops them); with several drafts the target replays them in the Prefill."""
    a, b = two_eagle_drafts
    layers = fetch_feature_layers([a.address, b.address], timeout_s=10)
    assert layers == (0, 1, 2)
    width = 3 * 64
    proposer = RemoteProposer([a.address, b.address], "test", 96, timeout_s=10, reconnect_interval_s=0.05,
                              feature_layers=layers)
    try:
        assert wait_for(lambda: proposer.pool.num_healthy == 2)
        seqs = {seq_id: [5, 6, 7, 8, 40 + seq_id] for seq_id in range(1, 5)}
        first = proposer.propose([request(i, t, 0, torch.randn(4, width, dtype=torch.bfloat16))
                                  for i, t in seqs.items()])
        assert all(len(s.tokens) == K for s in first) and a.seq_ids() == {1, 3}
        a.stop()
        assert wait_for(lambda: proposer.pool.num_healthy == 1)
        seqs = {i: [*t, 50] for i, t in seqs.items()}
        moved = proposer.propose([request(i, t, 4, torch.randn(2, width, dtype=torch.bfloat16))
                                  for i, t in seqs.items()])
        assert b.seq_ids() == {1, 2, 3, 4}
        assert all(len(s.tokens) == K for s in moved)  # 1 and 3 too: their features 0..5 came with the Prefill
        for seq_id in seqs:
            proposer.release(seq_id)
        assert len(proposer.sent_features) == 0
    finally:
        proposer.close()


# -- real processes: the default model, the shipped EAGLE-3 head -------------------------------------------

PROMPTS = ["Count from one to thirty in words, separated by commas.", "List the days of the week, one per line.",
           "Name ten animals, separated by commas.", "Write the alphabet in capital letters, separated by spaces."]
MAX_TOKENS = 64


@pytest.mark.model
def test_kill_9_of_one_draft_mid_stream_leaves_every_request_with_the_same_greedy_text(
        tmp_path_factory, default_model_path, offline_greedy):
    stack = launch(tmp_path_factory, "two-drafts", draft=DEFAULT_DRAFT, num_drafts=2, k=4)
    try:
        expected = [offline_greedy(p, MAX_TOKENS) for p in PROMPTS]
        target, drafts = stack.target_addresses[0], [stack.child("draft"), stack.child("draft-1")]
        assert wait_for(lambda: target_load(target).is_draft_connected, timeout_s=60)
        client = openai_client(stack.url, API_KEY)
        texts: dict[int, str] = {}
        threads = [threading.Thread(target=lambda i=i: texts.__setitem__(i, stream_chat(client, PROMPTS[i],
                                                                                         MAX_TOKENS, "sd")[0]))
                   for i in range(len(PROMPTS))]
        for thread in threads:
            thread.start()

        def both_draft() -> bool:  # sequences spread over both drafts, and both drafted for them
            loads = [draft_load(d.address) for d in drafts]
            return all(load.num_sequences > 0 and load.num_draft_tokens > 0 for load in loads)

        assert wait_for(both_draft, timeout_s=120)
        assert not texts and all(thread.is_alive() for thread in threads)  # mid-stream: none has finished
        survivor, victim = drafts
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        for thread in threads:
            thread.join(300)
        assert [texts.get(i) for i in range(len(PROMPTS))] == expected  # every request completed, same text
        assert target_load(target).is_draft_connected  # the survivor serves the target
        # the victim's sequences moved to the survivor, with their target features (so it could draft them)
        assert "sequence moved to another draft" in (stack.config.log_dir / "target-0.log").read_text()
        assert "no target features" not in (stack.config.log_dir / f"{survivor.name}.log").read_text()
        text, usage = stream_chat(client, PROMPTS[0], MAX_TOKENS, "sd")  # later requests speculate there
        assert text == expected[0] and usage["speculation"]["num_draft_tokens"] > 0
    finally:
        stop_stack(stack)
