"""The scheduler counts prefix-cache lookups in tokens (vLLM's prefix_cache_queries / prefix_cache_hits): every
first admission that may reuse the cache; a request scoring its prompt (prompt_logprobs) looks nothing up."""

from ssd.llm import LLM
from ssd.sampling.params import SamplingParams

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def test_queries_and_hits_in_tokens(tiny_llama) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4)
    scheduler = llm.engine.scheduler
    prompt = list(range(2, 40))  # 38 tokens: 9 full blocks of 4 can come from the cache
    llm.generate([prompt], PARAMS)
    assert (scheduler.num_prefix_queried_tokens, scheduler.num_prefix_hit_tokens) == (38, 0)
    out = llm.generate([prompt], PARAMS)[0]
    assert (scheduler.num_prefix_queried_tokens, scheduler.num_prefix_hit_tokens) == (76, 36)
    assert out.num_cached_prompt_tokens == 36
    llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=0))
    assert (scheduler.num_prefix_queried_tokens, scheduler.num_prefix_hit_tokens) == (76, 36)


def test_nothing_is_queried_with_the_cache_off(tiny_llama) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4, enable_prefix_caching=False)
    llm.generate([list(range(2, 40))] * 2, PARAMS)
    assert (llm.engine.scheduler.num_prefix_queried_tokens, llm.engine.scheduler.num_prefix_hit_tokens) == (0, 0)
