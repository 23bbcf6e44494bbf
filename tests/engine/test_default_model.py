"""The real default model (SmolLM2-135M-Instruct) in float32: exactness against HF and itself."""

import pytest
import torch

from ssd.context import ForwardMode
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.runtime.model_runner import ForwardItem
from ssd.sampling.params import SamplingParams

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis to a ten-year-old.",
    "List three uses of a paperclip.",
    "Why is the sky blue?",
    "Give me a haiku about autumn.",
    "What is 17 times 23?",
    "Translate 'good morning' into Spanish.",
]


@pytest.fixture(scope="module")
def llm(default_model_path):
    return LLM(str(default_model_path), dtype="float32", max_num_seqs=8)


@pytest.fixture(scope="module")
def prompts(llm):
    return [llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": q}])) for q in QUESTIONS]


def test_greedy_matches_hf_generate(llm, prompts, default_model_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(default_model_path), dtype=torch.float32).eval()
    params = SamplingParams(max_tokens=64)  # both stop at EOS (HF's min_new_tokens would mask it)
    for ids in prompts[:5]:
        ours = llm.generate([ids], params)[0].token_ids
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)
        assert ours == ref[0, len(ids) :].tolist()


def test_batch_of_eight_equals_one_by_one(llm, prompts):
    params = SamplingParams(max_tokens=32)
    together = [o.token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([ids], params)[0].token_ids for ids in prompts]
    assert together == alone


def test_repeated_prompt_reuses_cached_blocks(llm, prompts):
    params = SamplingParams(max_tokens=24)
    long_prompt = prompts[2] + prompts[3]  # > 2 blocks of 16
    first = llm.generate([long_prompt], params)[0]
    hits = llm.engine.block_manager.num_prefix_hit_blocks
    second = llm.generate([long_prompt], params)[0]
    assert second.num_cached_prompt_tokens >= 16 * ((len(long_prompt) - 1) // 16)
    assert llm.engine.block_manager.num_prefix_hit_blocks > hits
    assert second.token_ids == first.token_ids


def test_forced_preemption_gives_identical_output(default_model_path, prompts, llm):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(prompts[:4], params)]
    # room for ~2 sequences at a time: 4 sequences must take turns through preemption
    need = max(len(p) for p in prompts[:4]) + 40
    small = LLM(str(default_model_path), dtype="float32", max_num_seqs=8, enable_prefix_caching=False)
    small.engine.block_manager.__init__(2 * (need // 16 + 1) + 1, 16, False)
    outs = small.generate(prompts[:4], params)
    assert small.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == expected


def test_verify_forward_equals_decode_steps(llm, prompts):
    runner, bm = llm.engine.runner, llm.engine.block_manager

    class Seq:
        def __init__(self) -> None:
            self.block_table, self.num_cached_tokens, self.num_hashed_blocks = [], 0, 0

    ids = prompts[0]
    new = llm.generate([ids], SamplingParams(max_tokens=5, ignore_eos=True))[0].token_ids
    a, b = Seq(), Seq()
    for s in (a, b):
        bm.ensure_capacity(s, len(ids) + 5)
        runner.forward([ForwardItem(ids, 0, s.block_table)], ForwardMode.PREFILL)
    verify = runner.forward([ForwardItem(new, len(ids), a.block_table, num_logits=5)], ForwardMode.VERIFY).logits
    steps = [
        runner.forward([ForwardItem([t], len(ids) + i, b.block_table)], ForwardMode.DECODE).logits[0]
        for i, t in enumerate(new)
    ]
    assert (verify - torch.stack(steps)).abs().max().item() <= 1e-4
    bm.free(a)
    bm.free(b)


def test_chat_answers_conversations_through_the_template(llm):
    one = [{"role": "user", "content": "Name a colour."}]
    two = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a fruit."}]
    params = SamplingParams(max_tokens=6)
    expected = [llm.generate(llm.chat_prompt(c), params)[0].token_ids for c in (one, two)]
    assert [o.token_ids for o in llm.chat([one, two], params)] == expected
    assert llm.chat(one, params)[0].token_ids == expected[0]
    with pytest.raises(InvalidRequestError, match="no messages"):
        llm.chat([], params)
