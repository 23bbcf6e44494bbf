"""Generation that captures its own training data: in float32 it answers exactly like the serving engine, and
what it stores per position equals a teacher-forced forward over the finished prompt + answer."""

import torch

from draft_training.capture_generation import generate_captured
from draft_training.target_features import TargetFeatureExtractor
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams

PROMPTS = [list(range(2, 20)), list(range(30, 41)), list(range(5, 50)), [7, 8, 9]]


def _engine_answers(folder, params):  # type: ignore[no-untyped-def]
    llm = LLM(str(folder), dtype="float32", max_num_seqs=len(PROMPTS))
    return [o.token_ids for o in llm.generate(PROMPTS, params)], llm.engine.info.eos_token_ids


def test_greedy_answers_match_the_engine_and_captures_match_teacher_forcing(tiny_llama):
    plain = SamplingParams(temperature=0.0, max_tokens=12)
    reference, eos = _engine_answers(tiny_llama, plain)
    stop = reference[2][4]  # a token one answer produces mid-way: stopping there ends rows at different steps
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop,))
    expected, _ = _engine_answers(tiny_llama, params)
    assert len(set(map(len, expected))) > 1

    extractor = TargetFeatureExtractor(tiny_llama, torch.float32, aux_layers=(0, 1, 2), max_batch_tokens=64)
    captured = generate_captured(extractor, PROMPTS, params, eos, top_k=5)
    assert [c.tokens[c.prompt_len :] for c in captured] == expected
    assert [c.tokens[: c.prompt_len] for c in captured] == PROMPTS

    forced = extractor.capture([c.tokens for c in captured], [c.prompt_len for c in captured], top_k=5)
    for got, want in zip(captured, forced, strict=True):
        n = len(got.tokens)
        assert got.features.shape == (n, 3 * 64) and got.topk_ids.shape == (n, 5)
        torch.testing.assert_close(got.features.float(), want.features.float(), atol=1e-2, rtol=1e-2)  # both bf16
        assert torch.equal(got.topk_ids, want.topk_ids)
        torch.testing.assert_close(got.topk_logprobs, want.topk_logprobs, atol=1e-4, rtol=1e-4)


def test_sampled_answers_are_seeded(tiny_llama):
    extractor = TargetFeatureExtractor(tiny_llama, torch.float32, aux_layers=(0, 1, 2), max_batch_tokens=64)
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=3)
    first = generate_captured(extractor, PROMPTS, params, frozenset(), top_k=4)
    again = generate_captured(extractor, PROMPTS, params, frozenset(), top_k=4)
    assert [c.tokens for c in first] == [c.tokens for c in again]
    assert all(len(c.tokens) == len(p) + 8 for c, p in zip(first, PROMPTS, strict=True))
    other = generate_captured(extractor, PROMPTS, SamplingParams(temperature=1.0, max_tokens=8, seed=4), frozenset(), top_k=4)
    assert [c.tokens for c in other] != [c.tokens for c in first]
    assert generate_captured(extractor, [], params, frozenset(), top_k=4) == []
