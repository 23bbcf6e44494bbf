"""`catch_up`: a draft brought up to the committed tokens while the target takes plain steps (mode auto).

A draft model and an EAGLE-3 head catch up in one forward and then propose exactly what they would have proposed
catching up inside the proposal (float32). In one process, SSD catches up on its worker: after plain steps of
mode auto the drafts hold every committed token but the last, and greedy output is plain greedy's.
"""

import threading
from collections.abc import Collection

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig
from ssd.engine.mode_choice import PLAIN, SPECULATE_OR_PLAIN, ModeChooser
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.ngram import NgramProposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome
from tests.engine_steps import run_steps
from tests.speculation.test_eagle3_sd import tiny_target_draft_and_head

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]
K = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_draft_and_head(tmp_path_factory)


def _request(tokens: list[int], features: torch.Tensor | None = None, start: int = 0, seq_id: int = 1,
             temperature: float = 0.0) -> ProposeRequest:
    return ProposeRequest(seq_id, list(tokens), K, temperature, torch.Generator().manual_seed(3), features=features,
                          features_start=start)


def _draft(folders) -> DraftModelProposer:
    return DraftModelProposer(folders[1], "float32", 96, block_size=4, kv_cache_memory_mb=8)


def test_a_draft_model_catches_up_then_proposes_what_it_would_have(folders):
    fresh, fed = _draft(folders), _draft(folders)
    fed.catch_up([_request(PROMPT[:4])])
    assert fed.seqs[1].num_cached_tokens == 3  # all but the last: the next proposal feeds it
    fed.catch_up([_request(PROMPT)])  # more tokens committed by plain steps: only the new ones run
    assert fed.seqs[1].num_cached_tokens == len(PROMPT) - 1
    fed.catch_up([_request(PROMPT)])  # nothing new: nothing runs
    for temperature in (0.0, 0.8):
        a = fresh.propose([_request(PROMPT, temperature=temperature)])[0]
        b = fed.propose([_request(PROMPT, temperature=temperature)])[0]
        assert a.tokens == b.tokens
        if temperature > 0:
            torch.testing.assert_close(a.q, b.q)
        for proposer in (fresh, fed):  # roll back to the prompt for the next comparison
            proposer.observe(1, RoundOutcome(1, len(PROMPT), [PROMPT[-1]]))


def test_a_draft_model_catches_up_a_batch_in_one_forward(folders):
    draft = _draft(folders)
    calls = []
    forward = draft.worker.runner.forward
    draft.worker.runner.forward = lambda items, *a, **k: (calls.append(len(items)), forward(items, *a, **k))[1]
    draft.catch_up([_request(PROMPT, seq_id=1), _request(PROMPT[:5], seq_id=2), _request([7], seq_id=3)])
    assert calls == [2]  # a one-token sequence has nothing to catch up on
    assert [draft.seqs[i].num_cached_tokens for i in (1, 2, 3)] == [len(PROMPT) - 1, 4, 0]


def test_an_eagle3_head_catches_up_from_features_then_proposes_what_it_would_have(folders):
    target, _, head = folders
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    fresh = Eagle3Proposer(head, llm.engine.worker.input_embedding(), llm.engine.model_config, "float32")
    fed = Eagle3Proposer(head, llm.engine.worker.input_embedding(), llm.engine.model_config, "float32")
    features = torch.randn(len(PROMPT) - 1, 3 * llm.engine.model_config.hidden_size, generator=torch.Generator()
                           .manual_seed(0))  # [n, 3d]: positions 0..n-1 (the last token's come with its verify)
    fed.catch_up([_request(PROMPT[:5], features[:4])])
    before = fed.num_head_positions
    fed.catch_up([_request(PROMPT, features[4:], start=4)])
    assert fed.num_head_positions > before
    a = fresh.propose([_request(PROMPT, features)])[0]
    b = fed.propose([_request(PROMPT)])[0]
    assert a.tokens == b.tokens and len(a.tokens) == K


def test_ngram_lookup_has_nothing_to_catch_up():
    proposer = NgramProposer()
    proposer.catch_up([_request(PROMPT)])
    assert not proposer.feeds_in_background


class _PlainThenSpeculate(ModeChooser):
    """Plain steps for the first `plain` decode steps, then speculation."""

    def __init__(self, plain: int) -> None:
        super().__init__()
        self.plain = plain

    def choose(self, batch_size: int, options: tuple[str, ...] = SPECULATE_OR_PLAIN, lookahead: int = 0,
               unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
        return PLAIN if sum(self.num_rounds.values()) < self.plain else options[0]


def test_in_process_ssd_drafts_catch_up_during_plain_steps(folders):
    target, draft, _ = folders
    prompts = [PROMPT, [20, 21, 22], [30, 31, 32, 33, 34]]
    opts = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = [o.token_ids for o in LLM(str(target), **opts).generate(prompts, params)]
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=K, ssd=SsdConfig())
    llm = LLM(str(target), speculation=spec, **opts)
    engine = llm.engine
    engine.mode_chooser = _PlainThenSpeculate(plain=5)
    auto = SamplingParams(max_tokens=16, ignore_eos=True, adaptive=True)
    ids = [engine.add_request(p, auto) for p in prompts]
    while sum(engine.mode_chooser.num_rounds.values()) < 5:
        engine.step()
    overlapped = engine.speculative_decoder.proposer
    assert overlapped.feeds_in_background
    overlapped.worker.call(lambda: None)  # the catch-ups queued on the worker have run
    neural = overlapped.speculator.neural
    for seq_id in ids:
        seq = engine.seqs[seq_id]
        assert seq.num_draft_seen == seq.num_tokens
        assert neural.seqs[seq_id].num_cached_tokens == seq.num_tokens - 1
    tokens = {i: list(engine.seqs[i].output_token_ids) for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.seq_id].extend(out.new_token_ids)
    assert [tokens[i] for i in ids] == plain
    assert engine.mode_chooser.num_rounds["speculate"] > 0


def test_in_process_eagle3_ssd_keeps_greedy_output_across_plain_steps(folders):
    """The head catches up from the plain steps' features on the worker; the rounds after them draft on."""
    target, _, head = folders
    prompts = [PROMPT, [20, 21, 22]]
    opts = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8)
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = [o.token_ids for o in LLM(str(target), **opts).generate(prompts, params)]
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=K, ssd=SsdConfig())
    engine = LLM(str(target), speculation=spec, **opts).engine
    engine.mode_chooser = _PlainThenSpeculate(plain=6)
    ids = [engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True, adaptive=True)) for p in prompts]
    while sum(engine.mode_chooser.num_rounds.values()) < 6:
        engine.step()
    overlapped = engine.speculative_decoder.proposer
    overlapped.worker.call(lambda: None)
    heads = overlapped.speculator.neural.seqs
    assert all(heads[i].num_real == engine.seqs[i].num_tokens - 1 for i in ids)  # every position with features
    tokens = {i: list(engine.seqs[i].output_token_ids) for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.seq_id].extend(out.new_token_ids)
    assert [tokens[i] for i in ids] == plain
    assert engine.speculative_decoder.counters.num_accepted_tokens > 0


def test_in_process_ssd_takes_plain_steps_while_its_worker_prefills_new_prompts(folders):
    """The prefill's catch-up queues the prompts on the speculator's worker. While it has not run (the worker is
    held here), mode auto takes plain steps whatever the chooser would take, recorded unmeasured; then it
    speculates, and greedy output is plain greedy's."""
    target, draft, _ = folders
    prompts = [PROMPT, [20, 21, 22]]
    opts = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8)
    plain = [o.token_ids for o in LLM(str(target), **opts).generate(prompts, SamplingParams(max_tokens=16,
                                                                                           ignore_eos=True))]
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=K, ssd=SsdConfig())
    engine = LLM(str(target), speculation=spec, **opts).engine
    engine.mode_chooser = _PlainThenSpeculate(plain=0)
    overlapped = engine.speculative_decoder.proposer
    gate = threading.Event()
    overlapped.worker.submit(gate.wait, 30)
    try:
        ids = [engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True, adaptive=True)) for p in prompts]
        tokens: dict[int, list[int]] = {i: [] for i in ids}
        run_steps(engine, tokens, 4)  # the prefill, then decode steps while the worker holds the prompts' catch-up
        chooser = engine.mode_chooser
        assert overlapped.catching_up
        assert chooser.num_draft_waits == chooser.num_rounds[PLAIN] == 3 == sum(chooser.num_rounds.values())
    finally:
        gate.set()
    overlapped.worker.call(lambda: None)
    assert not overlapped.catching_up
    run_steps(engine, tokens)
    assert [tokens[i] for i in ids] == plain
    assert chooser.num_rounds["speculate"] > 0
