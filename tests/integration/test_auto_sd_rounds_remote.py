"""Mode auto's SD rounds across the wire: a target engine with a RemoteProposer and an in-process draft server.

Adaptive SSD requests under a chooser that cycles speculate, sd and plain step by step: the SD rounds go out with
their sequences in Round.sd_round_seq_ids, come back without a cache-hit flag (the target counts no lookup for
them), and greedy output equals plain AR token for token.
"""

import threading
from collections.abc import Collection
from dataclasses import replace

import pytest

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from ssd.config import DecodeMode, EngineConfig
from ssd.engine.llm_engine import LLMEngine
from ssd.engine.mode_choice import PLAIN, SD, SPECULATE
from ssd.sampling.params import SamplingParams
from target_service.config import remote_speculation
from target_service.remote_proposer import RemoteProposer, fetch_feature_layers
from tests.cycling_chooser import CyclingChooser
from tests.engine_steps import run_steps
from tests.integration.helpers import wait_for
from tests.integration.threaded_draft import threaded_draft_server
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_target_and_draft

K = 3
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return write_tiny_target_and_draft(tmp_path_factory, "auto-sd")


@pytest.fixture(scope="module")
def draft_address(models):
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(models[1]), kv_cache_memory_mb=8)))
    with threaded_draft_server(draft, str(models[1])) as address:
        yield address


def _generate(engine: LLMEngine, params: SamplingParams,
              proposer: RemoteProposer | None = None) -> list[list[int]]:
    """Every prompt to the end; with `proposer`, each step waits until its draft has acknowledged the prompts it was
    handed (20 tokens of the tiny model can otherwise all pass in plain steps on a loaded machine, whatever the
    chooser takes)."""
    ids = [engine.add_request(p, params) for p in PROMPTS]
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    while engine.has_unfinished():
        if proposer is not None:
            assert wait_for(lambda: not proposer.catching_up)
        run_steps(engine, tokens, 1)
    return [tokens[i] for i in ids]


class _PlainFirst(CyclingChooser):
    """Cycles plain, speculate, sd: the first decode step is plain, so the draft first hears of the sequences in a
    catch-up."""

    def choose(self, batch_size: int, options: tuple[str, ...] = (), lookahead: int = 0, unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
        return options[(sum(self.num_rounds.values()) + len(options) - 1) % len(options)]


def _adaptive_run(target, address: str, chooser: CyclingChooser,  # noqa: ANN001 - a model folder
                  feature_layers: tuple[int, ...] = ()) -> tuple[LLMEngine, list]:
    """Adaptive SSD requests on a target engine speculating with the draft at `address` under `chooser`; asserts
    greedy output equals plain AR's and returns the engine and every SessionRequest its session sent."""
    config = EngineConfig(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    plain = _generate(LLMEngine(config), SamplingParams(max_tokens=20, ignore_eos=True))
    proposer = RemoteProposer(address, "test", 96, timeout_s=10, reconnect_interval_s=0.05,
                              feature_layers=feature_layers)
    try:
        assert wait_for(lambda: proposer.is_connected)
        session = proposer.pool.sessions[0]
        sent, send = [], session.send
        session.send = lambda message: (sent.append(message), send(message))[1]
        engine = LLMEngine(replace(config, speculation=remote_speculation(K, None, 8)), proposer=proposer)
        engine.mode_chooser = chooser
        params = SamplingParams(max_tokens=20, ignore_eos=True, adaptive=True, mode=DecodeMode.SSD)
        assert _generate(engine, params, proposer) == plain
        return engine, sent
    finally:
        proposer.close()


def test_sd_rounds_of_remote_ssd_sequences_build_nothing_and_keep_greedy_output(models, draft_address):
    engine, sent = _adaptive_run(models[0], draft_address, CyclingChooser())
    rounds = engine.mode_chooser.num_rounds
    assert min(rounds[SPECULATE], rounds[SD], rounds[PLAIN]) > 0
    sd_rounds = [m.round for m in sent if m.HasField("round") and m.round.sd_round_seq_ids]
    assert len(sd_rounds) == rounds[SD]
    counters = engine.speculative_decoder.counters
    assert 0 < counters.num_cache_lookups < counters.num_drafts  # SD rounds are no lookups


def test_plain_steps_feed_the_remote_draft_and_output_stays_greedy(models, draft_address):
    """After each plain step (and each prefill) the target sends the draft what it committed (a catch_up message; only
    one that brings prompts asks for an acknowledgement); the draft then holds every token, so the next round's
    Outcome brings none new; greedy output equals AR."""
    engine, sent = _adaptive_run(models[0], draft_address, _PlainFirst())
    catch_ups = [m for m in sent if m.HasField("catch_up")]
    assert 0 < len(catch_ups) <= engine.mode_chooser.num_rounds[PLAIN] + len(PROMPTS)
    assert all((m.round_id > 0) == bool(m.catch_up.prefills) for m in catch_ups)
    assert any(m.catch_up.prefills for m in catch_ups)  # the prompts went to the draft before any round
    fed = False
    for message in sent:
        if message.HasField("catch_up"):
            fed = True
        elif message.HasField("round") and fed:  # the round right after a catch-up: nothing new to bring
            assert message.round.outcomes and all(not o.new_token_ids for o in message.round.outcomes)
            fed = False


def test_a_prefill_hands_the_remote_draft_the_new_prompts_at_once(models, draft_address):
    """Right after the target's prefill the draft gets the new prompts in a catch_up message, so it prefills them
    beside the target's first decode step (at batch 16 the first SSD round waited ~115 ms for that prefill,
    docs/benchmarks.md 2026-12-07); the first round (speculative here) brings Outcomes, not Prefills, and greedy
    output equals AR."""
    engine, sent = _adaptive_run(models[0], draft_address, CyclingChooser())
    first_round = next(i for i, m in enumerate(sent) if m.HasField("round"))
    early = [m.catch_up for m in sent[:first_round] if m.HasField("catch_up")]
    assert sum(len(c.prefills) for c in early) == len(PROMPTS)
    assert not sent[first_round].round.prefills and sent[first_round].round.outcomes
    assert engine.mode_chooser.num_rounds[SPECULATE] > 0


@pytest.fixture(scope="module")
def eagle_address(models, tmp_path_factory):
    target, _ = models
    head = tmp_path_factory.mktemp("auto-eagle3")
    write_tiny_head(head, target)
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(head)), target_model=str(target)))
    with threaded_draft_server(draft, str(head)) as address:
        yield address


def test_plain_steps_feed_a_remote_eagle3_head_its_features(models, eagle_address):
    """The same with an EAGLE-3 head: each catch-up carries the plain steps' target features, which the head runs
    over; the sequences keep drafting (no feature gap) and greedy output equals AR."""
    layers = fetch_feature_layers(eagle_address, timeout_s=10)
    engine, sent = _adaptive_run(models[0], eagle_address, _PlainFirst(), feature_layers=layers)
    catch_ups = [m.catch_up for m in sent if m.HasField("catch_up")]
    assert catch_ups and all(e.HasField("features") for m in catch_ups for e in [*m.prefills, *m.outcomes])
    counters = engine.speculative_decoder.counters
    assert counters.num_draft_tokens > 0 and counters.num_accepted_tokens > 0


class _AlwaysSpeculate(CyclingChooser):
    def choose(self, batch_size: int, options: tuple[str, ...] = (), lookahead: int = 0, unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
        return SPECULATE


def test_mode_auto_takes_plain_steps_until_the_draft_has_prefilled_the_prompts(models):
    """The prefill's catch-up asks the draft to acknowledge it. While the draft is still running it (held here),
    the engine takes plain steps whatever the chooser would take (a round would wait for the draft), recorded
    unmeasured; once the draft's CaughtUp arrives it speculates, and greedy output equals AR."""
    target, draft_folder = models
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(draft_folder), kv_cache_memory_mb=8)))
    gate = threading.Event()
    catch_up = draft.proposer.catch_up
    draft.proposer.catch_up = lambda requests: (gate.wait(30), catch_up(requests))[1]
    config = EngineConfig(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    plain = _generate(LLMEngine(config), SamplingParams(max_tokens=20, ignore_eos=True))
    with threaded_draft_server(draft, str(draft_folder)) as address:
        proposer = RemoteProposer(address, "test", 96, timeout_s=10, reconnect_interval_s=0.05)
        try:
            assert wait_for(lambda: proposer.is_connected)
            engine = LLMEngine(replace(config, speculation=remote_speculation(K, None, 8)), proposer=proposer)
            engine.mode_chooser = _AlwaysSpeculate()
            params = SamplingParams(max_tokens=20, ignore_eos=True, adaptive=True, mode=DecodeMode.SSD)
            ids = [engine.add_request(p, params) for p in PROMPTS]
            tokens: dict[int, list[int]] = {i: [] for i in ids}
            run_steps(engine, tokens, 4)  # the prefill, then decode steps while the draft holds the prompts' catch-up
            chooser = engine.mode_chooser
            assert proposer.catching_up
            assert chooser.num_draft_waits == chooser.num_rounds[PLAIN] == 3 == sum(chooser.num_rounds.values())
            gate.set()
            assert wait_for(lambda: not proposer.catching_up)
            run_steps(engine, tokens)
            assert [tokens[i] for i in ids] == plain
            assert chooser.num_rounds[SPECULATE] > 0
        finally:
            gate.set()
            proposer.close()
