"""Engine behaviour on a tiny random model: batching, preemption, prefix cache, sampling, errors."""

import pytest
import torch

from ssd.context import ForwardMode
from ssd.errors import CheckpointError, InvalidRequestError, ResourceExhaustedError, UnsupportedModelError
from ssd.llm import LLM
from ssd.runtime.model_runner import ForwardItem
from ssd.sampling.params import SamplingParams

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def make(path, **kw):
    return LLM(str(path), dtype="float32", block_size=4, **{"kv_cache_memory_mb": 4, **kw})


def test_batch_equals_one_by_one(tiny_llama):
    llm = make(tiny_llama)
    together = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    assert together == alone
    assert all(len(t) == 24 for t in together)


def test_preemption_keeps_every_token(tiny_llama):
    full = make(tiny_llama)
    expected = [o.token_ids for o in full.generate(PROMPTS, GREEDY)]
    # 3 layers * 2 (k, v) * 4 tokens * 2 heads * 16 dims * 4 bytes = 3 KiB per block; 40 KiB -> 13 blocks
    small = make(tiny_llama, kv_cache_memory_mb=1)
    small.engine.block_manager.__init__(13, 4, True)  # shrink the pool to force preemption
    outs = small.generate(PROMPTS, GREEDY)
    assert small.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == expected
    assert all(len(o.token_ids) == 24 for o in outs)  # the budget did not restart


def test_prefix_cache_reuse_gives_same_output(tiny_llama):
    llm = make(tiny_llama)
    prompt = list(range(2, 40))
    first = llm.generate([prompt], GREEDY)[0]
    hits_before = llm.engine.block_manager.num_prefix_hit_blocks
    second = llm.generate([prompt], GREEDY)[0]
    assert first.num_cached_prompt_tokens == 0
    assert second.num_cached_prompt_tokens == 36  # 9 full blocks of 4; the last token's block recomputed
    assert llm.engine.block_manager.num_prefix_hit_blocks - hits_before == 9
    assert second.token_ids == first.token_ids


def test_verify_forward_equals_decode_steps(tiny_llama):
    llm = make(tiny_llama)
    runner, bm = llm.engine.runner, llm.engine.block_manager

    class Seq:
        pass

    def paged(n):
        s = Seq()
        s.block_table, s.num_cached_tokens, s.num_hashed_blocks = [], 0, 0
        bm.ensure_capacity(s, n)
        return s.block_table

    prompt, new = [3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44]
    a, b = paged(16), paged(16)
    runner.forward([ForwardItem(prompt, 0, a)], ForwardMode.PREFILL)
    verify = runner.forward([ForwardItem(new, len(prompt), a, num_logits=5)], ForwardMode.VERIFY).logits
    runner.forward([ForwardItem(prompt, 0, b)], ForwardMode.PREFILL)
    steps = [
        runner.forward([ForwardItem([t], len(prompt) + i, b)], ForwardMode.DECODE).logits[0]
        for i, t in enumerate(new)
    ]
    assert (verify - torch.stack(steps)).abs().max().item() <= 1e-4


def test_seeded_sampling_reproducible_and_seed_dependent(tiny_llama):
    llm = make(tiny_llama)
    p = lambda seed: SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_tokens=16, seed=seed, ignore_eos=True)  # noqa: E731
    a = llm.generate([PROMPTS[0]], p(7))[0].token_ids
    b = llm.generate([PROMPTS[0]], p(7))[0].token_ids
    c = llm.generate([PROMPTS[0]], p(8))[0].token_ids
    batched = llm.generate(PROMPTS, [p(7)] * len(PROMPTS))[0].token_ids
    assert a == b == batched
    assert a != c


def test_stop_tokens_and_eos(tiny_llama):
    llm = make(tiny_llama)
    free = llm.generate([PROMPTS[1]], GREEDY)[0].token_ids
    stop = free[5]
    out = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=24, stop_token_ids=(stop,), ignore_eos=True))[0]
    assert out.finish_reason.value == "stop"
    assert out.token_ids == free[: free.index(stop) + 1]


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_tokens=0), dict(max_tokens=-3), dict(temperature=-0.5), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)],
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)


def test_bad_requests_leave_engine_working(tiny_llama):
    llm = make(tiny_llama, max_model_len=32)
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate([[]], GREEDY)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        llm.generate([list(range(2, 40))], GREEDY)
    with pytest.raises(InvalidRequestError, match="token ids"):
        llm.generate([[5, 10_000]], GREEDY)
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        llm.generate(["text needs a tokenizer"], GREEDY)
    assert not llm.engine.has_unfinished()
    assert len(llm.generate([PROMPTS[0]], SamplingParams(max_tokens=4))[0].token_ids) <= 4


def test_request_larger_than_cache_is_rejected(tiny_llama):
    llm = make(tiny_llama, kv_cache_memory_mb=1)
    llm.engine.block_manager.__init__(4, 4, True)
    with pytest.raises(ResourceExhaustedError):
        llm.generate([PROMPTS[3]], SamplingParams(max_tokens=64))


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10, "hidden_size": 8, '
                                          '"intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}')
    with pytest.raises(UnsupportedModelError, match="llama"):
        LLM(str(tmp_path))


def test_stream_yields_tokens_and_abort_frees_blocks(tiny_llama):
    llm = make(tiny_llama)
    free_before = llm.engine.block_manager.num_free_blocks
    stream = llm.generate_stream(PROMPTS[0], GREEDY)
    got = [next(stream).token_ids[0] for _ in range(3)]
    stream.close()
    assert got == llm.generate([PROMPTS[0]], GREEDY)[0].token_ids[:3]
    assert llm.engine.block_manager.num_free_blocks == free_before
    assert not llm.engine.has_unfinished()
