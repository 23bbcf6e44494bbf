"""Per-token logprobs: the target's raw distribution at each generated position, the same numbers whether the
tokens come from plain decoding or from speculative rounds, and exactly one per returned token."""

import pytest
import torch

from draft_training.target_features import TargetFeatureExtractor
from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.errors import InvalidRequestError
from ssd.layers import cpu_kernels
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd_kernels.cpu import extension as own_ext

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 14, 15, 9, 10, 11], [20, 21, 22, 20, 21]]


def _llm(models, speculation=None):  # type: ignore[no-untyped-def]
    return LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=speculation)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_targets_raw_distribution(models, temperature):
    params = SamplingParams(temperature=temperature, max_tokens=12, ignore_eos=True, seed=1, logprobs=3)
    outs = _llm(models).generate(PROMPTS, params)
    extractor = TargetFeatureExtractor(models[0], torch.float32, aux_layers=(0, 1, 2), max_batch_tokens=64)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 12
        logits = extractor.extract([prompt + out.token_ids])[0].logits  # [n, V]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # the distribution of each answer token
        for i, lp in enumerate(out.logprobs):
            assert lp.token_id == out.token_ids[i]
            assert lp.logprob == pytest.approx(float(logp[i, lp.token_id]), abs=1e-4)
            values, ids = logp[i].topk(3)
            assert [t for t, _ in lp.top] == ids.tolist()
            assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-4)


@pytest.mark.parametrize("shape", ["chain", "tree", "ssd"])
def test_speculative_logprobs_equal_plain_ones(models, shape):
    params = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=2)
    plain = _llm(models).generate(PROMPTS, params)
    spec = SpeculationConfig(ProposerChoice(str(models[0])), num_speculative_tokens=3,  # the target drafts itself
                             tree=TreeShape(budget=8, depth=3, top_k=2) if shape == "tree" else None,
                             ssd=SsdConfig() if shape == "ssd" else None)
    llm = _llm(models, spec)
    outs = llm.generate(PROMPTS, params)
    counters = llm.engine.speculative_decoder.counters
    assert counters.num_accepted_tokens > counters.num_drafts  # tokens at depth > 1 came from accepted drafts
    for a, b in zip(plain, outs, strict=True):
        assert a.token_ids == b.token_ids
        assert [x.token_id for x in b.logprobs] == b.token_ids
        assert [x.logprob for x in b.logprobs] == pytest.approx([x.logprob for x in a.logprobs], abs=1e-4)
        assert [[t for t, _ in x.top] for x in b.logprobs] == [[t for t, _ in x.top] for x in a.logprobs]


@pytest.mark.parametrize("shape", ["chain", "ssd"])
def test_bfloat16_speculative_logprobs_are_plain_ones_bit_for_bit(models, shape):
    """On a CPU with AVX512-BF16 every kernel of a decode step and of a chain verify (the bf16 GEMM, the layer ops,
    few-query attention) gives a row the same bits whatever the rows around it, so in bfloat16 too a verified
    position's distribution is the decode step's, exactly. (Elsewhere bf16 kernels round differently for 1 and K + 1
    rows, and speculation only nearly matches plain decoding.)"""
    ext = cpu_kernels.extension()
    if ext is None or own_ext.BF16_AVX512 not in own_ext.supported_paths(ext):
        pytest.skip("this CPU has no AVX512-BF16: the bf16 kernels are not row-invariant here")
    params = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=2)
    bf16 = {"dtype": "bfloat16", "block_size": 4, "kv_cache_memory_mb": 8}
    plain = LLM(str(models[0]), **bf16).generate(PROMPTS, params)
    spec = SpeculationConfig(ProposerChoice(str(models[0])), num_speculative_tokens=3,
                             ssd=SsdConfig() if shape == "ssd" else None)
    llm = LLM(str(models[0]), speculation=spec, **bf16)
    outs = llm.generate(PROMPTS, params)
    counters = llm.engine.speculative_decoder.counters
    assert counters.num_accepted_tokens > counters.num_drafts
    for a, b in zip(plain, outs, strict=True):
        assert a.token_ids == b.token_ids
        assert [(x.token_id, x.logprob, x.top) for x in b.logprobs] == [(x.token_id, x.logprob, x.top) for x in a.logprobs]


def test_one_logprob_per_returned_token_after_a_stop(models):
    first = _llm(models).generate(PROMPTS[:1], SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids
    stop = first[5]
    spec = SpeculationConfig(ProposerChoice(str(models[1])), num_speculative_tokens=3)
    for llm in (_llm(models), _llm(models, spec)):
        out = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(stop,),
                                                       logprobs=0))[0]
        assert out.token_ids[-1] == stop and len(out.logprobs) == len(out.token_ids)
        assert all(lp.top == () for lp in out.logprobs)
        streamed = [lp for d in llm.generate_stream(PROMPTS[0], SamplingParams(
            max_tokens=10, ignore_eos=True, stop_token_ids=(stop,), logprobs=1)) for lp in d.logprobs or []]
        assert [lp.token_id for lp in streamed] == out.token_ids


def test_logprobs_off_by_default_and_validated(models):
    assert _llm(models).generate(PROMPTS[:1], SamplingParams(max_tokens=3))[0].logprobs is None
    for bad in (-1, 21, True, 1.5):
        with pytest.raises(InvalidRequestError, match="logprobs"):
            SamplingParams(logprobs=bad)


def test_prompt_logprobs_score_every_prompt_token_after_the_first(models):
    extractor = TargetFeatureExtractor(models[0], torch.float32, aux_layers=(0, 1, 2), max_batch_tokens=64)
    spec = SpeculationConfig(ProposerChoice(str(models[1])), num_speculative_tokens=3)
    for llm in (_llm(models), _llm(models, spec)):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))  # leaves the prompt's blocks in the prefix cache
        params = [SamplingParams(max_tokens=4, prompt_logprobs=2, logprobs=1), SamplingParams(max_tokens=4)]
        scored, plain = llm.generate([PROMPTS[0], PROMPTS[1]], params)
        assert plain.prompt_logprobs is None
        assert [lp.token_id for lp in scored.prompt_logprobs] == PROMPTS[0][1:]  # cached prefix or not
        logp = torch.log_softmax(extractor.extract([PROMPTS[0]])[0].logits[:-1], dim=-1)  # row i: token i + 1
        for i, lp in enumerate(scored.prompt_logprobs):
            assert lp.logprob == pytest.approx(float(logp[i, lp.token_id]), abs=1e-4)
            assert [t for t, _ in lp.top] == logp[i].topk(2).indices.tolist()
        assert scored.token_ids == plain_answer(llm, PROMPTS[0])  # scoring changes nothing else
        streamed = list(llm.generate_stream(PROMPTS[0], SamplingParams(max_tokens=3, prompt_logprobs=0)))
        assert [lp.token_id for lp in streamed[0].prompt_logprobs] == PROMPTS[0][1:]
        assert all(d.prompt_logprobs is None for d in streamed[1:])
    assert _llm(models).generate([PROMPTS[2][:1]], SamplingParams(max_tokens=1, prompt_logprobs=0))[0].prompt_logprobs == []
    for bad in (-1, 21, True):
        with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)


def plain_answer(llm, prompt):  # type: ignore[no-untyped-def]
    return llm.generate(prompt, SamplingParams(max_tokens=4))[0].token_ids
