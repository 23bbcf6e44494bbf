"""Tensor parallelism: a target sharded over 2 CPU ranks (real worker processes, gloo) computes what the whole
model computes: logits within float32 rounding, greedy tokens equal, in AR, SD and SSD, Llama and Qwen3."""

import os
import subprocess
import sys

import pytest
import torch

from ssd.config import DecodeMode, ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.context import ForwardMode
from ssd.distributed import WHOLE, TensorParallel, current_tp, divide, tensor_parallel
from ssd.errors import EngineDeadError, InvalidRequestError
from ssd.llm import LLM
from ssd.runtime.model_runner import ForwardItem
from ssd.sampling.params import SamplingParams
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 14, 15, 9], [20, 21, 22]]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
OPTS = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8, num_threads=1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(llama target, qwen3 target, one-layer draft, EAGLE-3 head for the llama target)."""
    llama, qwen, draft, head = (tmp_path_factory.mktemp(n) for n in ("llama", "qwen3", "draft", "eagle3"))
    write_tiny_checkpoint(llama, "llama", seed=0)
    write_tiny_checkpoint(qwen, "qwen3", seed=2)
    write_tiny_checkpoint(draft, "llama", seed=1, num_hidden_layers=1)
    write_tiny_head(head, llama)
    return llama, qwen, draft, head


@pytest.fixture(scope="module")
def whole(folders):
    """Greedy token ids of the whole (unsharded) llama target, AR."""
    llm = LLM(str(folders[0]), **OPTS)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def _generate(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    with llm:
        return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_layers_built_outside_the_context_are_whole():
    tp = TensorParallel(rank=1, size=2)
    with tensor_parallel(tp):
        assert current_tp() is tp
    assert current_tp() is WHOLE
    with pytest.raises(ValueError, match="num_key_value_heads \\(3\\) is not divisible by the tensor-parallel size 2"):
        divide(3, 2, "num_key_value_heads")


def test_sharded_logits_and_greedy_equal_the_whole_model(folders, whole):
    llama = folders[0]
    one, two = LLM(str(llama), **OPTS), LLM(str(llama), tensor_parallel_size=2, **OPTS)
    try:
        assert two.engine.runner.local.model.model.layers[0].self_attn.num_heads == 2  # half of the 4 heads
        items = [ForwardItem(PROMPTS[0], 0, list(range(3)), num_logits=len(PROMPTS[0]))]
        ref = one.engine.runner.forward(items, ForwardMode.PREFILL).logits  # [10, V]
        got = two.engine.runner.forward(items, ForwardMode.PREFILL).logits
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == whole
    finally:
        two.close()


def test_qwen3_sharded_greedy_equals_whole(folders):
    qwen = folders[1]
    ref = _generate(LLM(str(qwen), **OPTS))
    assert _generate(LLM(str(qwen), tensor_parallel_size=2, **OPTS)) == ref


@pytest.mark.parametrize("draft", ["ngram", "model", "eagle3"])
def test_sd_on_a_sharded_target_equals_ar(folders, whole, draft):
    llama, _, draft_model, head = folders
    name = {"ngram": "ngram", "model": str(draft_model), "eagle3": str(head)}[draft]
    tree = TreeShape(budget=6, depth=3, top_k=2) if draft == "eagle3" else None
    spec = SpeculationConfig(ProposerChoice(name), num_speculative_tokens=3, tree=tree)
    assert _generate(LLM(str(llama), tensor_parallel_size=2, speculation=spec, **OPTS)) == whole


def test_ssd_on_a_sharded_target_equals_ar(folders, whole):
    llama, _, draft_model, _ = folders
    spec = SpeculationConfig(ProposerChoice(str(draft_model)), num_speculative_tokens=3, ssd=SsdConfig(fan_out_budget=4))
    llm = LLM(str(llama), tensor_parallel_size=2, speculation=spec, **OPTS)
    assert _generate(llm, SamplingParams(max_tokens=24, ignore_eos=True, mode=DecodeMode.SSD)) == whole


def test_seeded_sampling_matches_the_whole_model(folders):
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=7)
    llama = folders[0]
    assert _generate(LLM(str(llama), tensor_parallel_size=2, **OPTS), params) == _generate(LLM(str(llama), **OPTS),
                                                                                             params)


def test_a_size_that_does_not_divide_the_heads_is_refused_before_any_process_starts(folders):
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size 3 does not divide .*num_attention_heads = 4"):
        LLM(str(folders[0]), tensor_parallel_size=3, **OPTS)
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size must be a positive integer"):
        LLM(str(folders[0]), tensor_parallel_size=0, **OPTS)


def test_close_stops_the_workers_and_unpins_the_caller(folders):
    before = os.sched_getaffinity(0)
    llm = LLM(str(folders[0]), tensor_parallel_size=2, **OPTS)
    procs = llm.engine.tp_workers.procs
    llm.close()
    assert all(p.wait(timeout=30) == 0 for p in procs)
    assert os.sched_getaffinity(0) == before


def test_a_dead_rank_is_a_clear_engine_error(folders):
    llm = LLM(str(folders[0]), tensor_parallel_size=2, **OPTS)
    try:
        proc = llm.engine.tp_workers.procs[0]
        proc.kill()
        proc.wait(timeout=30)
        with pytest.raises(EngineDeadError, match="tensor-parallel rank 1 exited"):
            llm.generate(PROMPTS, GREEDY)
    finally:
        llm.close()


def test_the_worker_module_refuses_to_run_by_hand():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSD_TP_")}
    out = subprocess.run([sys.executable, "-m", "ssd.runtime.tensor_parallel_worker"], capture_output=True,
                         text=True, timeout=120, env=env, check=False)
    assert out.returncode == 2 and "started by a tensor-parallel engine" in out.stderr
