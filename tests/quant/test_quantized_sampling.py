"""Speculative sampling stays exact with a quantized target: the first 3 tokens follow the quantized model's
own distribution (chi-square), and the float model's distribution is rejected (the test sees the weights)."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig
from ssd.llm import LLM
from ssd.quantized_weights import quantize_int4, quantize_int8
from ssd.sampling.params import SamplingParams
from tests.speculation.exact_distribution import chi_square_pvalue, joint_distribution, tiny_target_and_draft

NUM_RUNS = 20_000
PROMPT = [3, 7, 2, 9]
TEMP = 0.9


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return tiny_target_and_draft(tmp_path_factory)


def _dequantized_copy(hf, quantization: str):  # noqa: ANN001, ANN202 - an HF model
    """The HF model with every decoder linear replaced by its quantized-then-dequantized weight."""
    import copy

    model = copy.deepcopy(hf)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.endswith("_proj"):
                w = module.weight.float()
                q = quantize_int4(w, 32) if quantization == "int4" else quantize_int8(w)
                module.weight.copy_(q.dequantize().double())
    return model


@pytest.mark.parametrize("quantization", ["int4", pytest.param("int8", marks=pytest.mark.slow)])  # ~3 min each, shared CPU
def test_speculative_sampling_matches_the_quantized_target(setup, quantization):
    target, draft, hf = setup
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=2, k_schedule=((1024, 2),))
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
              speculation=spec, quantization=quantization)
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True) for i in range(NUM_RUNS)]
    samples = [tuple(o.token_ids) for o in llm.generate([PROMPT] * NUM_RUNS, params)]
    counters = llm.engine.speculative_decoder.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    assert chi_square_pvalue(samples, joint_distribution(_dequantized_copy(hf, quantization), PROMPT, TEMP)) > 0.001
    if quantization == "int4":  # int8's error is too small for 20,000 samples to tell the float model apart
        assert chi_square_pvalue(samples, joint_distribution(hf, PROMPT, TEMP)) < 0.001
