"""The fused CPU decoder layer and stack (ssd/layers/fused_layer.py, fused_stack.py, ssd_kernels/cpu/decoder_layer.cpp)
give the bits of the layers' own op-by-op forward: every logit of decode and chain-verify forwards, for each kind of linear it runs
(float32 and bfloat16 weights, the own int4 kernel, torch's int4pack / int8pack), with and without biases."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig
from ssd.layers.fused_layer import FusedDecoderLayer
from ssd.layers.fused_stack import FusedDecoderStack
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.speculation.test_eagle3_sd import tiny_target_and_head
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 9, 10], [20, 21]]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def biased_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama-bias")
    write_tiny_checkpoint(folder, "llama", seed=3, attention_bias=True)
    return folder


def _run(llm: LLM, mode: str, monkeypatch) -> tuple[list[list[int]], list[torch.Tensor], list[int]]:
    """(greedy tokens, every logits tensor and aux stream computed, forwards the stack / the layers served) with the
    whole stack as one call ("stack"), each layer as one call ("layers") or op by op ("ops")."""
    model = llm.engine.worker.model
    model.model.fused_stack = FusedDecoderStack() if mode == "stack" else None
    for layer in model.model.layers:
        layer.fused = None if mode == "ops" else FusedDecoderLayer()
    seen: list[torch.Tensor] = []
    served = [0, 0]
    compute, forward = model.compute_logits, model.model.forward
    stack_call, layer_call = FusedDecoderStack.__call__, FusedDecoderLayer.__call__

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        out = compute(hidden)
        seen.append(out.clone())
        return out

    def recording_aux(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = forward(*args, **kwargs)
        seen.extend(a.clone() for a in out[1])
        return out

    def counting(call, slot):  # type: ignore[no-untyped-def]
        def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            out = call(self, *args, **kwargs)
            served[slot] += out is not None
            return out
        return counted

    monkeypatch.setattr(model, "compute_logits", recording)
    monkeypatch.setattr(model.model, "forward", recording_aux)
    monkeypatch.setattr(FusedDecoderStack, "__call__", counting(stack_call, 0))
    monkeypatch.setattr(FusedDecoderLayer, "__call__", counting(layer_call, 1))
    tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    tokens += [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    monkeypatch.undo()
    return tokens, seen, served


def _same_run(llm: LLM, monkeypatch) -> None:
    """The stack, the layers and the ops give the same tokens, logits and aux streams; each served forwards."""
    tokens, seen, served = _run(llm, "stack", monkeypatch)
    for mode in ("layers", "ops"):
        expected_tokens, expected, other = _run(llm, mode, monkeypatch)
        assert tokens == expected_tokens
        assert len(seen) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(seen, expected, strict=True))
        assert other == ([0, 0] if mode == "ops" else [0, served[0] * len(llm.engine.worker.model.model.layers)])
    assert served[0] > 0 and served[1] == 0


CASES = [("float32", "none"), ("bfloat16", "none"), ("float32", "int4"), ("bfloat16", "int4"),
         ("bfloat16", "int8")]


@pytest.mark.parametrize("dtype,quantization", CASES)
@pytest.mark.parametrize("spec", [False, True], ids=["decode", "verify"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_fused_layer_gives_the_op_by_op_logits(tiny_llama, biased_llama, monkeypatch, dtype, quantization, spec, bias):
    speculation = SpeculationConfig(ProposerChoice("ngram"), num_speculative_tokens=3) if spec else None
    llm = LLM(str(biased_llama if bias else tiny_llama), dtype=dtype, quantization=quantization, block_size=4,
              kv_cache_memory_mb=4, speculation=speculation, enable_prefix_caching=False)  # both runs the same work
    _same_run(llm, monkeypatch)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_stack_gives_the_aux_streams_of_the_loop(tmp_path_factory, monkeypatch, dtype):
    """With an EAGLE-3 head the target's forwards return the residual streams entering layers 0, 1 and 2: the stack
    returns the loop's bits, and the head's proposals (hence the verified tokens) are the same."""
    target, head = tiny_target_and_head(tmp_path_factory)
    speculation = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3)
    llm = LLM(str(target), dtype=dtype, block_size=4, kv_cache_memory_mb=4, speculation=speculation,
              enable_prefix_caching=False)
    _same_run(llm, monkeypatch)


def test_fused_layer_is_built_again_when_a_weight_is_replaced(tiny_llama):
    """Quantizing or moving a linear after a forward replaces its weight objects: the next forward builds the
    fused layer and the stack again from the new ones (an in-place change needs nothing: the call reads the same storage)."""
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4)
    model = llm.engine.worker.model.model
    layer = model.layers[-1]
    llm.generate([PROMPTS[0]], GREEDY)
    [(key, built)] = layer.fused._built.items()
    [(stack_key, stack)] = model.fused_stack._built.items()
    assert built[1] is not None and stack.stack is not None
    llm.generate([PROMPTS[0]], GREEDY)
    assert layer.fused._built[key] is built and model.fused_stack._built[stack_key] is stack
    down = layer.mlp.down_proj
    down.weight = torch.nn.Parameter(down.weight.detach().clone(), requires_grad=False)
    down.pack()
    llm.generate([PROMPTS[0]], GREEDY)
    assert layer.fused._built[key] is not built and layer.fused._built[key][1] is not None
    assert model.fused_stack._built[stack_key] is not stack and model.fused_stack._built[stack_key].stack is not None
