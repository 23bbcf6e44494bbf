"""The fused CPU decoder layer (ssd/layers/fused_layer.py, ssd_kernels/cpu/decoder_layer.cpp) gives the bits of
the layer's own op-by-op forward: every logit of decode and chain-verify forwards, for each kind of linear it runs
(float32 and bfloat16 weights, the own int4 kernel, torch's int4pack / int8pack), with and without biases."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig
from ssd.layers.fused_layer import FusedDecoderLayer
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 9, 10], [20, 21]]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def biased_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama-bias")
    write_tiny_checkpoint(folder, "llama", seed=3, attention_bias=True)
    return folder


def _run(llm: LLM, fused: bool, monkeypatch) -> tuple[list[list[int]], list[torch.Tensor], int]:
    """(greedy tokens, every logits tensor computed, forwards the fused call served) with the fused layer on / off."""
    model = llm.engine.worker.model
    for layer in model.model.layers:
        layer.fused = FusedDecoderLayer() if fused else None
    logits: list[torch.Tensor] = []
    served = [0]
    compute, call = model.compute_logits, FusedDecoderLayer.__call__

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        out = compute(hidden)
        logits.append(out.clone())
        return out

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = call(self, *args, **kwargs)
        served[0] += out is not None
        return out

    monkeypatch.setattr(model, "compute_logits", recording)
    monkeypatch.setattr(FusedDecoderLayer, "__call__", counting)
    tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    tokens += [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    monkeypatch.undo()
    return tokens, logits, served[0]


CASES = [("float32", "none"), ("bfloat16", "none"), ("float32", "int4"), ("bfloat16", "int4"),
         ("bfloat16", "int8")]


@pytest.mark.parametrize("dtype,quantization", CASES)
@pytest.mark.parametrize("spec", [False, True], ids=["decode", "verify"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_fused_layer_gives_the_op_by_op_logits(tiny_llama, biased_llama, monkeypatch, dtype, quantization, spec, bias):
    speculation = SpeculationConfig(ProposerChoice("ngram"), num_speculative_tokens=3) if spec else None
    llm = LLM(str(biased_llama if bias else tiny_llama), dtype=dtype, quantization=quantization, block_size=4,
              kv_cache_memory_mb=4, speculation=speculation, enable_prefix_caching=False)  # both runs the same work
    tokens, logits, served = _run(llm, True, monkeypatch)
    expected_tokens, expected_logits, unfused = _run(llm, False, monkeypatch)
    assert served > 0 and unfused == 0
    assert tokens == expected_tokens
    assert len(logits) == len(expected_logits)
    assert all(torch.equal(a, b) for a, b in zip(logits, expected_logits, strict=True))


def test_fused_layer_is_built_again_when_a_weight_is_replaced(tiny_llama):
    """Quantizing or moving a linear after a forward replaces its weight objects: the next forward builds the
    fused call again from the new ones (an in-place change needs nothing: the call reads the same storage)."""
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4)
    layer = llm.engine.worker.model.model.layers[0]
    llm.generate([PROMPTS[0]], GREEDY)
    [(key, built)] = layer.fused._built.items()
    assert built[1] is not None
    llm.generate([PROMPTS[0]], GREEDY)
    assert layer.fused._built[key] is built
    down = layer.mlp.down_proj
    down.weight = torch.nn.Parameter(down.weight.detach().clone(), requires_grad=False)
    down.pack()
    llm.generate([PROMPTS[0]], GREEDY)
    assert layer.fused._built[key] is not built and layer.fused._built[key][1] is not None
