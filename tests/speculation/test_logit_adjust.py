"""Logit bias and presence / frequency penalties: OpenAI's arithmetic (penalties on generated tokens only), the
vLLM / HF extensions (repetition penalty over prompt and answer, min_tokens, min_p), and speculation stays exact
with them (greedy SD / tree / SSD output equals plain greedy output with the same adjustments)."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.sampling.logit_adjust import adjust_logits
from ssd.sampling.params import SamplingParams
from ssd.sampling.sampler import target_probs

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


def test_repetition_penalty_covers_the_prompt_the_answer_and_the_path():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 2.0]]).expand(2, -1)
    out = adjust_logits(logits, [1], [[], [2]], SamplingParams(repetition_penalty=2.0), prompt_ids=[0])
    assert out[0].tolist() == [1.0, -4.0, 2.0, -2.0, 2.0]  # prompt token 0 and answer token 1
    assert out[1].tolist() == [1.0, -4.0, 1.0, -2.0, 2.0]  # and token 2 on the path


def test_min_tokens_bars_the_ending_tokens_until_the_answer_is_long_enough():
    logits = torch.zeros(3, 5)
    params = SamplingParams(min_tokens=3, max_tokens=8)
    out = adjust_logits(logits, [4], [[], [1], [1, 2]], params, stop_ids=frozenset({0, 3}))
    inf = float("-inf")
    assert out.tolist() == [[inf, 0, 0, inf, 0], [inf, 0, 0, inf, 0], [0, 0, 0, 0, 0]]  # row 2 stands at 3 tokens
    assert adjust_logits(logits[:1], [4, 4, 4], [[]], params, stop_ids=frozenset({0})).tolist() == [[0.0] * 5]
    assert logits.eq(0).all()  # the caller's logits are left as they were


def test_min_p_keeps_tokens_at_least_min_p_times_the_likeliest():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = target_probs(logits, SamplingParams(temperature=1.0, min_p=0.25))
    assert probs[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])


@pytest.mark.parametrize(("name", "value"), [("presence_penalty", 2.5), ("frequency_penalty", -3),
                                             ("presence_penalty", float("nan")), ("frequency_penalty", True),
                                             ("repetition_penalty", 0), ("repetition_penalty", float("inf")),
                                             ("min_p", 1.5), ("min_p", -0.1), ("min_tokens", -1), ("min_tokens", 65),
                                             ("min_tokens", 2.0)])
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
def test_greedy_speculation_with_penalties_equals_plain(models, plain, repeated, shape, which):
    spec = SpeculationConfig(ProposerChoice(str(models[which])), num_speculative_tokens=3,
                             tree=TreeShape(budget=8, depth=3, top_k=2) if shape == "tree" else None,
                             ssd=SsdConfig() if shape == "ssd" else None)
    llm = _llm(models, spec)
    assert [o.token_ids for o in llm.generate(PROMPTS, PENALIZED)] == plain
    assert [llm.generate([p], PENALIZED)[0].token_ids for p in PROMPTS] == plain  # batch 1 too
    params, expected = repeated
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected


@pytest.fixture(scope="module")
def repeated(models):
    """Params with a repetition penalty and min_tokens before a stop id, and their plain greedy answers."""
    llm = _llm(models)
    free = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))]
    stop = free[0][2]  # would end the first answer after 3 tokens
    params = SamplingParams(max_tokens=24, ignore_eos=True, repetition_penalty=1.5, min_tokens=12,
                            stop_token_ids=(stop,))
    answers = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert answers != free and all(stop not in a[:11] for a in answers)
    return params, answers
