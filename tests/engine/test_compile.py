"""The compiled forward (torch.compile, ssd/runtime/compile.py) against eager: logits and greedy tokens.

Compiling takes minutes on this project's 2-core CI machine, so the compiled tests are few and marked slow.
"""

import pytest
import torch

from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.runtime.compile import resolve_compile
from ssd.sampling.params import SamplingParams

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)
# float32: inductor's fused norms / RoPE and its packed matmuls reorder sums. Measured max |difference|: under
# 1e-4 on the tiny model; 2.6e-3 on the 30-layer default model (logits up to ~20); greedy tokens identical.
TINY_LOGIT_TOLERANCE = 1e-4
DEFAULT_MODEL_LOGIT_TOLERANCE = 5e-3


def test_compile_choice():
    cpu = torch.device("cpu")
    assert not resolve_compile("auto", cpu, enforce_eager=False)  # measured slower here: see resolve_compile
    assert resolve_compile("on", cpu, enforce_eager=False)
    assert not resolve_compile("on", cpu, enforce_eager=True)  # --enforce-eager wins
    with pytest.raises(InvalidRequestError, match="tensor parallelism"):
        resolve_compile("on", cpu, enforce_eager=False, tensor_parallel_size=2)


@pytest.mark.slow
def test_compiled_tiny_model_matches_eager(tiny_llama):
    eager = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4, compile="off")
    compiled = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4, compile="on")
    assert compiled.engine.worker.is_compiled and not eager.engine.worker.is_compiled
    want = [o.token_ids for o in eager.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in compiled.generate(PROMPTS, GREEDY)] == want
    _check_logits(eager, compiled, TINY_LOGIT_TOLERANCE)


@pytest.mark.slow
def test_compiled_default_model_matches_eager(default_model_path):
    eager = LLM(str(default_model_path), dtype="float32", compile="off")
    compiled = LLM(str(default_model_path), dtype="float32", compile="on")
    prompts = [eager.tokenizer.encode("The capital of France is"), eager.tokenizer.encode("def fibonacci(n):")]
    want = [o.token_ids for o in eager.generate(prompts, GREEDY)]
    assert [o.token_ids for o in compiled.generate(prompts, GREEDY)] == want
    _check_logits(eager, compiled, DEFAULT_MODEL_LOGIT_TOLERANCE)


def _check_logits(eager: LLM, compiled: LLM, atol: float) -> None:
    """One prefill forward of the same items in both (prefill of 7 tokens, then a batch of two decodes)."""
    from ssd.context import ForwardMode
    from ssd.runtime.model_runner import ForwardItem

    for items, mode in (([ForwardItem(list(range(3, 10)), 0, [0, 1], num_logits=7)], ForwardMode.PREFILL),
                        ([ForwardItem([11], 7, [0, 1]), ForwardItem([12], 3, [2])], ForwardMode.DECODE)):
        a = eager.engine.worker.runner.forward(items, mode).logits
        b = compiled.engine.worker.runner.forward(items, mode).logits
        assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max()
