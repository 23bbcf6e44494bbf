"""Logit bias and presence / frequency penalties: OpenAI's arithmetic (penalties on generated tokens only), and
speculation stays exact with them (greedy SD / tree / SSD output equals plain greedy output with the same
adjustments)."""

import pytest
import torch

from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.sampling.logit_adjust import adjust_logits
from ssd.sampling.params import SamplingParams
from ssd.spec.config import SpeculationConfig, SsdConfig
from ssd.spec.proposer import TreeShape

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 14, 15, 9, 10, 11], [20, 21, 22, 20, 21]]
PENALIZED = SamplingParams(max_tokens=24, ignore_eos=True, presence_penalty=0.8, frequency_penalty=0.5,
                           logit_bias={3: 2.0, 7: -100})


def test_penalty_arithmetic_counts_outputs_and_the_path():
    logits = torch.zeros(3, 6)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = adjust_logits(logits, [1, 1, 2], [[], [3], [3, 1]], params)
    assert out[0].tolist() == [0, -1.0, -0.75, 0, 0, 0]  # token 1 twice: 0.5 + 2 * 0.25
    assert out[1].tolist() == [0, -1.0, -0.75, -0.75, 0, 0]
    assert out[2].tolist() == [0, -1.25, -0.75, -0.75, 0, 0]
    assert adjust_logits(logits, [1], [[]], SamplingParams()) is logits  # no penalties: untouched


@pytest.mark.parametrize(("name", "value"), [("presence_penalty", 2.5), ("frequency_penalty", -3),
                                             ("presence_penalty", float("nan")), ("frequency_penalty", True)])
def test_penalties_are_range_checked(name, value):
    with pytest.raises(InvalidRequestError, match=name):
        SamplingParams(**{name: value})


def _llm(models, speculation=None):  # type: ignore[no-untyped-def]
    return LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=speculation)


@pytest.fixture(scope="module")
def plain(models):
    llm = _llm(models)
    penalized = [o.token_ids for o in llm.generate(PROMPTS, PENALIZED)]
    free = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
    assert penalized != free  # the penalties change this model's greedy answers
    return penalized


@pytest.mark.parametrize("shape", ["chain", "tree", "ssd"])
@pytest.mark.parametrize("which", [0, 1], ids=["self-draft", "other-draft"])
def test_greedy_speculation_with_penalties_equals_plain(models, plain, shape, which):
    spec = SpeculationConfig(draft=str(models[which]), num_speculative_tokens=3,
                             tree=TreeShape(budget=8, depth=3, top_k=2) if shape == "tree" else None,
                             ssd=SsdConfig() if shape == "ssd" else None)
    llm = _llm(models, spec)
    assert [o.token_ids for o in llm.generate(PROMPTS, PENALIZED)] == plain
    assert [llm.generate([p], PENALIZED)[0].token_ids for p in PROMPTS] == plain  # batch 1 too
