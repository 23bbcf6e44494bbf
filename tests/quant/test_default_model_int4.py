"""The default model on its own Q4_1 weights (the pull's int4 cache): the same logits as the dequantized float
folder in float32, and the cache's weights equal the float folder's, tensor by tensor."""

import pytest
import torch

from ssd.context import ForwardMode
from ssd.layers.quantized_linear import Int4Matmul
from ssd.llm import LLM
from ssd.loader.safetensors_loader import read_tensor
from ssd.quantized_weights import has_int4_cache, load_int4_cache, load_q8_head
from ssd.runtime.model_runner import ForwardItem

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def cache_path(default_model_path):
    if not has_int4_cache(default_model_path):
        pytest.fail("the default model has no int4 cache: run `ssd models pull smollm2-135m-instruct` again")
    return default_model_path


def test_the_cache_holds_the_gguf_values_of_the_float_folder(cache_path):
    """Every cached Q4_1 linear dequantizes to the float folder's tensor (both came from the same GGUF)."""
    own = load_int4_cache(cache_path)
    assert len(own) == 30 * 7
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                 "model.layers.17.mlp.gate_proj", "model.layers.29.mlp.down_proj"):
        float_weight = read_tensor(cache_path, f"{name}.weight").float()
        torch.testing.assert_close(own[name].dequantize(), float_weight, rtol=0, atol=1e-6)


def _prefill_logits(llm: LLM, ids: list[int]) -> torch.Tensor:  # [len(ids), V]
    class Seq:
        def __init__(self) -> None:
            self.block_table, self.num_cached_tokens, self.num_hashed_blocks = [], 0, 0

    seq = Seq()
    llm.engine.block_manager.ensure_capacity(seq, len(ids))
    item = ForwardItem(ids, 0, seq.block_table, num_logits=len(ids))
    logits = llm.engine.runner.forward([item], ForwardMode.PREFILL).logits
    llm.engine.block_manager.free(seq)
    return logits


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-3), ("bfloat16", None)])
def test_own_int4_logits_equal_the_dequantized_models(cache_path, dtype, tolerance):
    """float32 (the own CPU kernel): equal within float tolerance. bfloat16 (the own bfloat16 kernel where the CPU
    has AVX512-BF16, else int4pack with bf16 scales): the same argmax at most positions; its error is the bf16
    rounding of activations (and int4pack's scales), not the weights."""
    ref = LLM(str(cache_path), dtype="float32", enable_prefix_caching=False)
    own = LLM(str(cache_path), dtype=dtype, quantization="auto", enable_prefix_caching=False)
    assert own.engine.worker.quantization.is_own
    int4 = [m for m in own.engine.model.modules() if isinstance(m, Int4Matmul)]
    assert len(int4) == 30 * 4 and all(m.has_own_kernel for m in int4)  # the GGUF's fp16 scales: the own kernel holds them
    # AUTO: float32 on the own kernel; bfloat16 on the own bfloat16 kernel where the CPU has one, else int4pack
    assert all(m.runs_own_kernel(torch.float32) for m in int4)
    assert all(m.runs_own_kernel(torch.bfloat16) == (m.own_bf16_blocks is not None) for m in int4)
    ids = ref.tokenizer.encode(ref.chat_prompt([{"role": "user", "content": "What is the capital of France?"}]))
    expected, got = _prefill_logits(ref, ids), _prefill_logits(own, ids)
    if tolerance is not None:
        assert (got - expected).abs().max().item() < tolerance
    else:
        assert (got.argmax(-1) == expected.argmax(-1)).float().mean().item() > 0.9


def test_the_q8_head_holds_the_gguf_values_of_the_float_head_and_serves_decode_rows(cache_path):
    """The cached Q8_0 head dequantizes exactly to the float folder's (tied) embedding; the own model's LM head
    reads it for a decode step's rows, with the float head's logits within float32 tolerance."""
    head = load_q8_head(cache_path)
    if head is None:
        pytest.fail("the default model has no q8_0 head cache: run `ssd models pull smollm2-135m-instruct` again")
    float_head = read_tensor(cache_path, "model.embed_tokens.weight").float()
    assert torch.equal(head.dequantize(), float_head)
    own = LLM(str(cache_path), dtype="float32", quantization="auto", enable_prefix_caching=False)
    lm_head = own.engine.model.lm_head
    assert lm_head.q8_blocks is not None and own.engine.worker.quantization.has_q8_head
    hidden = torch.randn(3, float_head.shape[1], generator=torch.Generator().manual_seed(0))
    got = lm_head(hidden)  # 3 rows: the q8 kernel
    assert (got - hidden @ float_head.t()).abs().max().item() < 1e-3
