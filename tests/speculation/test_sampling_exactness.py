"""Speculative sampling is exact: the first 3 tokens follow the target's distribution (chi-square).

20,000 seeded runs per case on a 16-token vocabulary; the test must also catch a broken verifier.
"""

from collections.abc import Collection

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, TreeShape
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation import verification
from tests.speculation.exact_distribution import chi_square_pvalue, joint_distribution, tiny_target_and_draft

NUM_RUNS = 20_000
PROMPT = [3, 7, 2, 9]
TEMP = 0.9


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target, draft, hf = tiny_target_and_draft(tmp_path_factory)
    return target, draft, joint_distribution(hf, PROMPT, TEMP), hf


def sample_first_tokens(target, spec: SpeculationConfig, draft_temperature: float | None,
                        penalties: dict | None = None) -> list[tuple]:
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
              speculation=spec)
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True,
                             draft_temperature=draft_temperature, **(penalties or {})) for i in range(NUM_RUNS)]
    outs = llm.generate([PROMPT] * NUM_RUNS, params)
    assert llm.engine.speculative_decoder.counters.num_drafts > 0
    counters = llm.engine.speculative_decoder.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    return [tuple(o.token_ids) for o in outs]


CASES = {
    "draft-q": dict(draft="model", tree=None, dtemp=None),  # q known: ratio test
    "draft-q-other-temperature": dict(draft="model", tree=None, dtemp=0.5),
    "one-hot-greedy-draft": dict(draft="model", tree=None, dtemp=0.0),  # no q: one-hot proposals
    "tree": dict(draft="model", tree=TreeShape(budget=6, depth=2, top_k=2), dtemp=None),
    "ngram": dict(draft="ngram", tree=None, dtemp=None),
}


def _spec(setup, case) -> SpeculationConfig:
    draft = setup[1]
    c = CASES[case]
    proposer = ProposerChoice(str(draft) if c["draft"] == "model" else "ngram", ngram_max=1)
    return SpeculationConfig(proposer, num_speculative_tokens=2, tree=c["tree"], k_schedule=((1024, 2),))


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_target_distribution(setup, case):
    samples = sample_first_tokens(setup[0], _spec(setup, case), CASES[case]["dtemp"])
    assert chi_square_pvalue(samples, setup[2]) > 0.001


def test_broken_verifier_is_caught(setup, monkeypatch):
    """The reference engine's bug: one-hot proposals accepted without the p(x) test."""
    real = verification._uniform
    monkeypatch.setattr(verification, "_uniform", lambda g: 0.0 if real(g) < 0.5 else 1.0)
    samples = sample_first_tokens(setup[0], _spec(setup, "one-hot-greedy-draft"), 0.0)
    assert chi_square_pvalue(samples, setup[2]) < 0.001


def test_speculative_sampling_with_penalties_matches_the_penalized_target(setup):
    """A tree draft (paths differ per node) against the target with presence and frequency penalties."""
    penalties = {"presence_penalty": 0.7, "frequency_penalty": 0.6}
    exact = joint_distribution(setup[3], PROMPT, TEMP, presence=0.7, frequency=0.6)
    samples = sample_first_tokens(setup[0], _spec(setup, "tree"), None, penalties)
    assert chi_square_pvalue(samples, exact) > 0.001
    assert chi_square_pvalue(samples, setup[2]) < 0.001  # and the unpenalized distribution is rejected


@pytest.mark.slow  # ~100 s; the same adjustment path as the penalties' chi-square test, which runs by default
def test_speculative_sampling_with_repetition_penalty_and_min_p_matches_the_adjusted_target(setup):
    """The vLLM extensions: a repetition penalty over prompt + answer (per tree node) and min-p truncation."""
    options = {"repetition_penalty": 1.6, "min_p": 0.08}
    exact = joint_distribution(setup[3], PROMPT, TEMP, repetition=1.6, min_p=0.08)
    samples = sample_first_tokens(setup[0], _spec(setup, "tree"), None, options)
    assert chi_square_pvalue(samples, exact) > 0.001
    assert chi_square_pvalue(samples, setup[2]) < 0.001


def test_joint_distribution_sums_to_one(setup):
    assert abs(sum(setup[2].values()) - 1.0) < 1e-9
    assert torch.isfinite(torch.tensor(list(setup[2].values()))).all()


def test_switching_between_speculation_and_plain_steps_matches_target_distribution(setup):
    """Adaptive requests (issue 28.3) under a chooser that flips between a speculative round and a plain step at
    every step: each step is exact on its own, so the tokens still follow the target."""
    from ssd.engine.mode_choice import PLAIN, SPECULATE, ModeChooser

    class Alternating(ModeChooser):
        def choose(self, batch_size: int, options: tuple[str, ...] = (), lookahead: int = 0,
                   unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
            return PLAIN if sum(self.num_rounds.values()) % 2 else SPECULATE

    llm = LLM(str(setup[0]), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
              speculation=_spec(setup, "draft-q"))
    llm.engine.mode_chooser = Alternating()
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True, adaptive=True)
              for i in range(NUM_RUNS)]
    samples = [tuple(o.token_ids) for o in llm.generate([PROMPT] * NUM_RUNS, params)]
    rounds = llm.engine.mode_chooser.num_rounds
    assert rounds[PLAIN] > 0 and rounds[SPECULATE] > 0
    assert chi_square_pvalue(samples, setup[2]) > 0.001
