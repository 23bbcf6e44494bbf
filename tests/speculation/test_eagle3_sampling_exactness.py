"""Speculative sampling with an EAGLE-3 head is exact at temperature > 0: chains, token trees and SSD branches
(cache hits and misses, Saguaro scaling) all give the target's distribution of the first 3 tokens (chi-square over
20,000 seeded runs on a 16-token vocabulary; the head drafts over a trimmed 12-token vocabulary, so q is widened
to the target's). Two planted bugs must be caught: a chain that reports q at another temperature than it sampled
at, and SSD branches that report the unscaled q while sampling Saguaro-scaled."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation import ssd_speculator
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from tests.speculation.exact_distribution import chi_square_pvalue, joint_distribution, tiny_target_and_draft
from tests.speculation.test_eagle3_sd import write_tiny_head

NUM_RUNS = 20_000
PROMPT = [3, 7, 2, 9]
TEMP = 0.9
DRAFT_VOCAB = 12  # of 16: the head cannot propose 4 of the target's tokens
CASES = {
    "chain": dict(tree=None, ssd=None),
    "tree": dict(tree=TreeShape(budget=6, depth=2, top_k=2), ssd=None),
    "ssd-neural-saguaro": dict(tree=None, ssd=SsdConfig(backup="neural", saguaro_c=0.5, fan_out_budget=4)),
    "ssd-fast-uniform": dict(tree=None, ssd=SsdConfig(backup="fast", fan_out="uniform", fan_out_budget=6)),
}
SLOW = {"tree", "ssd-fast-uniform"}  # the same widening paths as the chain and the neural SSD case


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target, _, hf = tiny_target_and_draft(tmp_path_factory)
    head = tmp_path_factory.mktemp("eagle3")
    write_tiny_head(head, target, draft_vocab=DRAFT_VOCAB)
    return target, head, joint_distribution(hf, PROMPT, TEMP)


def sample_first_tokens(setup, tree: TreeShape | None, ssd: SsdConfig | None) -> list[tuple]:
    target, head, _ = setup
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=2, tree=tree, k_schedule=((1024, 2),), ssd=ssd)
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
              speculation=spec)
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True) for i in range(NUM_RUNS)]
    outs = llm.generate([PROMPT] * NUM_RUNS, params)
    counters = llm.engine.speculative_decoder.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    if ssd is not None:
        assert counters.num_cache_hits > 500 and counters.num_cache_misses > 1000  # both paths well exercised
    return [tuple(o.token_ids) for o in outs]


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_eagle3_sampling_matches_target_distribution(setup, case):
    samples = sample_first_tokens(setup, CASES[case]["tree"], CASES[case]["ssd"])
    assert chi_square_pvalue(samples, setup[2]) > 0.001


def test_eagle3_chain_reporting_q_at_another_temperature_is_caught(setup, monkeypatch):
    """A broken head proposer: samples at the request's temperature but tells the verifier q at 3x it."""
    real = Eagle3Proposer._pick

    def broken(self, r, step, logprobs):  # noqa: ANN001, ANN202
        token, q = real(self, r, step, logprobs)
        if q is not None:
            q = self._to_target_q(torch.softmax(logprobs / (3 * r.temperature), dim=-1))
        return token, q

    monkeypatch.setattr(Eagle3Proposer, "_pick", broken)
    assert chi_square_pvalue(sample_first_tokens(setup, None, None), setup[2]) < 0.001


def test_eagle3_ssd_unscaled_q_with_saguaro_sampling_is_caught(setup, monkeypatch):
    """Broken SSD branches: sampled from the Saguaro-scaled q, reported as the unscaled one."""
    real = ssd_speculator.sample_branch_tokens

    def broken(logits, temperature, top, c, generator):  # noqa: ANN001, ANN202
        tokens, _ = real(logits, temperature, top, c, generator)
        return tokens, torch.softmax(logits / temperature, dim=-1)

    monkeypatch.setattr(ssd_speculator, "sample_branch_tokens", broken)
    samples = sample_first_tokens(setup, None, SsdConfig(backup="neural", saguaro_c=0.1, fan_out_budget=4))
    assert chi_square_pvalue(samples, setup[2]) < 0.001
