"""Step inputs: the kernel-style forward context built with tensor ops, and the masks derived from it on the device."""

import dataclasses

import pytest
import torch

from ssd.config import EngineConfig
from ssd.context import ForwardMode
from ssd.errors import InvalidRequestError
from ssd.layers.attention_backend import CpuBackend, FewQueries, TorchBackend, select_attention_backend
from ssd.layers.mask_bits import mask_bits, pack_mask
from ssd.layers.padded_attention import bucketed, padded_batch
from ssd.runtime.step_inputs import ForwardItem, StepInputs
from ssd.speculation.tree_mask import branch_mask

BS = 4


def dense_item_mask(it: ForwardItem) -> torch.Tensor:  # [n, total]: the mask the runner used to build on the host
    if it.attn_mask is not None:
        return it.attn_mask
    n = len(it.token_ids)
    total = it.start_position + n
    return torch.arange(total)[None, :] <= (it.start_position + torch.arange(n))[:, None]


def expected_slots(it: ForwardItem) -> list[int]:
    n = len(it.token_ids)
    return [it.block_table[p // BS] * BS + p % BS for p in range(it.start_position, it.start_position + n)]


def check(items: list[ForwardItem]) -> None:
    ctx, ids, positions = StepInputs(BS, torch.device("cpu")).build(items, ForwardMode.VERIFY)
    lengths = [len(it.token_ids) for it in items]
    assert ids.tolist() == [t for it in items for t in it.token_ids]
    assert ctx.num_tokens == sum(lengths)
    assert ctx.query_start_loc.tolist() == [sum(lengths[:b]) for b in range(len(items) + 1)]
    assert ctx.seq_lens.tolist() == [it.start_position + n for it, n in zip(items, lengths, strict=True)]
    assert ctx.slot_mapping.tolist() == [s for it in items for s in expected_slots(it)]
    for b, it in enumerate(items):
        assert ctx.block_tables[b, : len(it.block_table)].tolist() == it.block_table
    want_pos = [p for it, n in zip(items, lengths, strict=True)
                for p in (it.positions or range(it.start_position, it.start_position + n))]
    assert positions.tolist() == want_pos
    batch = padded_batch(ctx)
    assert batch.mask.shape == (len(items), 1, max(lengths), bucketed(ctx.max_seq_len))
    for b, (it, n) in enumerate(zip(items, lengths, strict=True)):
        total = it.start_position + n
        assert torch.equal(batch.mask[b, 0, :n, :total], dense_item_mask(it))
        assert not batch.mask[b, 0, :n, total:].any()  # the key bucket's padding is never attended
        all_slots = [it.block_table[p // BS] * BS + p % BS for p in range(total)]
        assert batch.kv_slots[b, :total].tolist() == all_slots


def test_causal_mixed_lengths():
    check([ForwardItem([1, 2, 3], 5, [7, 2]), ForwardItem([4], 0, [3]), ForwardItem([5, 6], 14, [0, 1, 4, 5])])


def test_uniform_decode_has_no_padding_gather():
    items = [ForwardItem([1], 6, [1, 2]), ForwardItem([2], 3, [3])]
    check(items)
    ctx, _, _ = StepInputs(BS, torch.device("cpu")).build(items, ForwardMode.DECODE)
    assert ctx.is_uniform and padded_batch(ctx).query_index is None and ctx.tree_mask is None


def tree_batch() -> list[ForwardItem]:
    """A token tree (a root and two children), a causal item and an SSD branch step at depth 1, in one forward."""
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree_mask = torch.cat([torch.ones(3, 6, dtype=torch.bool), tree], dim=1)  # [3, 9]
    branch = branch_mask(prefix=5, glue=3, glue_visible=[0, 2, 3], depth=1)  # [3, 5 + 3 + 6]
    return [
        ForwardItem([1, 2, 3], 6, [2, 3, 4], num_logits=3, positions=[6, 7, 7], attn_mask=tree_mask),
        ForwardItem([4, 5], 2, [9]),
        ForwardItem([6, 7, 8], 11, [10, 11, 12, 13], num_logits=3, positions=[9, 9, 9], attn_mask=branch),
    ]


def test_tree_and_causal_items_in_one_batch():
    items = tree_batch()
    check(items)
    ctx, _, _ = StepInputs(BS, torch.device("cpu")).build(items, ForwardMode.TREE)
    assert ctx.mask_start.tolist() == [6, 2, 5]  # the branch's glue is partly visible from key 5 on


def _attend_both_ways(items: list[ForwardItem], mode: ForwardMode) -> tuple[torch.Tensor, torch.Tensor]:
    """The cpu backend's attention and the torch path's for the same forward (float32, random q and cache)."""
    ctx, _, _ = StepInputs(BS, torch.device("cpu")).build(items, mode)
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(2, 2, 16 * BS, 16, generator=gen)  # [2, KVH, slots, D]: 16 blocks
    q = torch.randn(ctx.num_tokens, 4, 16, generator=gen)  # [T, H, D], two query heads per KV head
    cpu, reference = CpuBackend(), TorchBackend()
    meta = cpu.prepare(ctx)
    assert isinstance(meta, FewQueries) and meta.num_queries == 1  # a key list per query row, not the torch path
    out = cpu.attend(q, kv_cache, dataclasses.replace(ctx, attn_metadata=meta), 0.25)
    expected = reference.attend(q, kv_cache, dataclasses.replace(ctx, attn_metadata=reference.prepare(ctx)), 0.25)
    return out, expected


def test_the_cpu_op_attends_uneven_batches_and_trees_like_the_torch_path():
    trees = tree_batch()
    uneven = [ForwardItem([1, 2, 3], 5, [7, 2]), ForwardItem([4], 0, [3]), ForwardItem([5, 6], 14, [0, 1, 4, 5])]
    for items, mode in ((trees, ForwardMode.TREE), (uneven, ForwardMode.VERIFY)):
        out, expected = _attend_both_ways(items, mode)
        assert torch.allclose(out, expected, atol=1e-5)
    # the masks matter: the same tokens attended causally give the tree rows other values
    causal, _ = _attend_both_ways([dataclasses.replace(it, attn_mask=None) for it in trees], ForwardMode.VERIFY)
    tree_out, _ = _attend_both_ways(trees, ForwardMode.TREE)
    assert not torch.allclose(causal[2], tree_out[2], atol=1e-3) and torch.allclose(causal[:1], tree_out[:1])


def test_buffers_are_reused():
    inputs = StepInputs(BS, torch.device("cpu"))
    first, _, _ = inputs.build([ForwardItem([1, 2], 0, [0])], ForwardMode.PREFILL)
    second, _, _ = inputs.build([ForwardItem([3], 2, [0])], ForwardMode.DECODE)
    assert first.slot_mapping.data_ptr() == second.slot_mapping.data_ptr()


def test_pack_mask_round_trip_across_words():
    gen = torch.Generator().manual_seed(0)
    dense = torch.rand(5, 70, generator=gen) < 0.5
    dense[:, 31] = True  # the sign bit of the first word
    packed = pack_mask(dense)
    assert packed.dtype == torch.int32 and packed.shape == (5, 3)
    rel = torch.arange(96).expand(5, -1)
    bits = mask_bits(packed, rel)
    assert torch.equal(bits[:, :70], dense) and not bits[:, 70:].any()


def test_backend_choice_on_cpu(monkeypatch):
    cpu = torch.device("cpu")
    assert isinstance(select_attention_backend("auto", cpu), CpuBackend)  # the project's CPU kernels build here
    assert select_attention_backend("torch", cpu).name == "torch"
    assert select_attention_backend("cpu", cpu).name == "cpu"
    from ssd.layers import cpu_kernels

    monkeypatch.setattr(cpu_kernels, "extension", lambda: None)  # a CPU where they cannot build
    assert isinstance(select_attention_backend("auto", cpu), TorchBackend)
    with pytest.raises(InvalidRequestError, match="cpu needs"):
        select_attention_backend("cpu", cpu)
    with pytest.raises(InvalidRequestError, match="flash-attn needs CUDA"):
        select_attention_backend("flash-attn", cpu)
    with pytest.raises(InvalidRequestError):
        select_attention_backend("cudnn", cpu)


def test_engine_config_checks_step_options():
    with pytest.raises(InvalidRequestError, match="compile"):
        EngineConfig(model="m", compile="sometimes")
    with pytest.raises(InvalidRequestError, match="attention_backend"):
        EngineConfig(model="m", attention_backend="cudnn")


def test_triton_without_the_kernels_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.startswith("ssd_kernels") else
                        real_find_spec(name))
    with pytest.raises(InvalidRequestError, match="kernels package"):
        select_attention_backend("triton", torch.device("cpu"))


def test_the_cpu_layer_ops_give_the_torch_paths_greedy_tokens(tiny_llama, torch_layer_ops):
    """float32 greedy: the cpu backend with the layer ops (decode and verify through the C++ ops) == the torch
    backend on the layers' torch ops, token for token, alone and in a batch."""
    from ssd.layers import cpu_kernels
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    options = dict(dtype="float32", block_size=4, kv_cache_memory_mb=4)
    reference = LLM(str(tiny_llama), attention_backend="torch", **options)
    expected = [o.token_ids for o in reference.generate(prompts, greedy)]
    cpu_kernels.set_layer_ops(True)
    fused = LLM(str(tiny_llama), **options)
    assert fused.engine.worker.runner.backend.name == "cpu"
    assert [o.token_ids for o in fused.generate(prompts, greedy)] == expected
    assert [fused.generate([p], greedy)[0].token_ids for p in prompts] == expected


TRITON_SCRIPT = """
import sys
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
greedy = SamplingParams(max_tokens=12, ignore_eos=True)
runs = [LLM(sys.argv[1], dtype="float32", block_size=4, kv_cache_memory_mb=4, attention_backend=b) for b in ("torch", "triton")]
assert runs[1].engine.worker.runner.backend.name == "triton"
tokens = [[o.token_ids for o in llm.generate(prompts, greedy)] for llm in runs]
assert tokens[0] == tokens[1], tokens
"""


@pytest.mark.slow  # ~1 min: a fresh process, and the interpreter runs the kernel in Python
def test_triton_backend_matches_torch_under_the_interpreter(tiny_llama):
    """The kernels package's Triton paged attention, run on CPU by TRITON_INTERPRET=1 (set before triton loads)."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("ssd_kernels") is None or importlib.util.find_spec("triton") is None:
        pytest.skip("needs the kernels package and triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, str(tiny_llama)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
