"""Logits parity with HF transformers on tiny random models, over prefill and paged decode."""

import pytest
import torch

from ssd.context import ForwardMode
from ssd.llm import LLM
from ssd.runtime.model_runner import ForwardItem
from tests.tiny_models import LLAMA3_SCALING, write_tiny_checkpoint

CASES = {
    "llama-untied": dict(kind="llama"),
    "llama-tied": dict(kind="llama", tie_word_embeddings=True),
    "llama3-rope-scaling": dict(kind="llama", rope_scaling=LLAMA3_SCALING),
    "llama3-rope-scaling-tied": dict(kind="llama", rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True),
    "qwen3": dict(kind="qwen3"),
    "qwen3-tied-no-bias": dict(kind="qwen3", tie_word_embeddings=True, attention_bias=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf_over_prefill_and_decode(tmp_path, case):
    hf = write_tiny_checkpoint(tmp_path, **CASES[case])
    llm = LLM(str(tmp_path), dtype="float32", block_size=4, kv_cache_memory_mb=4)
    engine = llm.engine
    prompt = [5, 17, 42, 8, 9, 23, 77, 3, 11]
    ids = list(prompt)

    class Seq:  # a bare paged sequence for the block manager
        block_table: list[int] = []
        num_cached_tokens = 0
        num_hashed_blocks = 0
        token_ids = ids

    seq = Seq()
    seq.block_table = []
    engine.block_manager.ensure_capacity(seq, len(ids) + 21)
    out = engine.runner.forward([ForwardItem(ids, 0, seq.block_table, num_logits=len(ids))], ForwardMode.PREFILL)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (out.logits - ref).abs().max().item() <= 1e-4
    for _ in range(20):
        ids.append(int(out.logits[-1].argmax()))
        out = engine.runner.forward([ForwardItem(ids[-1:], len(ids) - 1, seq.block_table)], ForwardMode.DECODE)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0, -1]
        assert (out.logits[0] - ref).abs().max().item() <= 1e-4
