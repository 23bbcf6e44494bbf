"""A quantized target end to end: greedy sd and ssd == ar token for token (float32 activations), the
checkpoint's own int4 cache used by "auto", and tensor-parallel shards of the quantized weights."""

import pytest
import torch
from safetensors.torch import save_file

from ssd.config import EngineConfig, ProposerChoice, SpeculationConfig, SsdConfig
from ssd.distributed import TensorParallel, tensor_parallel
from ssd.errors import InvalidRequestError
from ssd.layers.linear import ColumnParallelLinear, RowParallelLinear
from ssd.layers.quantized_linear import Int4Matmul
from ssd.llm import LLM
from ssd.loader.model_loader import load_quantized_model
from ssd.loader.safetensors_loader import iter_tensors
from ssd.quantized_weights import (
    Int4Weight,
    load_int4_cache,
    quantize_int4,
    quantize_q8_0,
    save_int4_cache,
    save_q8_head,
)
from tests.speculation.test_eagle3_sd import tiny_target_draft_and_head
from tests.speculation.test_sd_greedy import PARAMS, PROMPTS

QUANTIZATIONS = ["int8", "int4", "int4:64"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_target_draft_and_head(tmp_path_factory)


def _llm(target, quantization: str, spec: SpeculationConfig | None = None) -> LLM:
    return LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8, quantization=quantization,
               speculation=spec)


def _greedy(llm: LLM, batch: int) -> list[list[int]]:
    outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS] if batch == 1 else llm.generate(PROMPTS, PARAMS)
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def expected(models):
    return {q: _greedy(_llm(models[0], q), 1) for q in QUANTIZATIONS}


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_quantized_target_really_is_quantized(models, expected, quantization):
    llm = _llm(models[0], quantization)
    model = llm.engine.worker.model
    assert sum(getattr(m, "quantized", None) is not None for m in model.modules()) == 4 * 3  # 4 linears x 3 layers
    assert llm.engine.worker.quantization.method == quantization.partition(":")[0]
    assert expected[quantization] != _greedy(_llm(models[0], "none"), 1)  # the weights changed the output


CASES = [("int4", "sd-draft-model", 1), ("int4", "sd-eagle3", 1), ("int4", "ssd", 1), ("int4", "sd-draft-model", 4),
         ("int4", "ssd", 4), ("int8", "sd-draft-model", 1), ("int8", "ssd", 4), ("int4:64", "sd-eagle3", 4)]


@pytest.mark.parametrize(("quantization", "which", "batch"), CASES)
def test_greedy_speculation_equals_ar_with_a_quantized_target(models, expected, quantization, which, batch):
    target, draft, head = models
    spec = {"sd-draft-model": SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3),
            "sd-eagle3": SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3),
            "ssd": SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3, ssd=SsdConfig(backup="neural"))}[which]
    llm = _llm(target, quantization, spec)
    assert _greedy(llm, batch) == expected[quantization]
    assert llm.engine.speculative_decoder.counters.num_drafts > 0


def test_auto_uses_the_checkpoints_own_int4_cache(models, tmp_path):
    """`auto` picks the cached int4 weights, which load exactly; without a cache `auto` means float."""
    target = models[0]
    _, _, spec = load_quantized_model(target, torch.float32, "auto")
    assert spec.method == "none"
    folder = _copy_with_int4_cache(target, tmp_path)
    model, _, spec = load_quantized_model(folder, torch.float32, "auto")
    assert spec.method == "int4" and spec.is_own
    qkv = model.model.layers[1].self_attn.qkv_proj.quantized
    weights = dict(iter_tensors(target))
    full = torch.cat([weights[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])  # [N, K]
    own = quantize_int4(full, 32).dequantize()
    x = torch.randn(2, full.shape[1])
    torch.testing.assert_close(qkv(x), x @ own.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantization", ["own", "int4", "int8"])
def test_tensor_parallel_shards_of_quantized_weights(models, tmp_path, quantization):
    """Two ranks' quantized shards (built without processes) give the whole layer's output: column-parallel
    layers concatenate, row-parallel layers sum (int8's per-channel scales are per rank's shard: close only)."""
    folder = _copy_with_int4_cache(models[0], tmp_path) if quantization == "own" else models[0]
    requested = "int4" if quantization == "own" else quantization
    whole, _, _ = load_quantized_model(folder, torch.float32, requested)
    ranks = []
    for rank in range(2):
        with tensor_parallel(TensorParallel(rank, 2)):
            ranks.append(load_quantized_model(folder, torch.float32, requested)[0])
    tolerance = 0.05 if quantization == "int8" else 1e-5
    for name, layer in whole.named_modules():
        if not isinstance(layer, ColumnParallelLinear | RowParallelLinear):
            continue
        shards = [dict(r.named_modules())[name].quantized for r in ranks]
        x = torch.randn(3, layer.quantized.in_features)
        if isinstance(layer, RowParallelLinear):
            parts = x.chunk(2, dim=1)
            y = shards[0](parts[0]) + shards[1](parts[1])
        else:
            y = torch.cat([shards[0](x), shards[1](x)], dim=1)  # each rank's q / k / v (or gate / up) slices
            y = _interleave_shards(layer, y)
        assert ((y - layer.quantized(x)).abs().max() / layer.quantized(x).abs().max()).item() < tolerance, name


def test_bad_quantization_is_refused():
    with pytest.raises(InvalidRequestError):
        EngineConfig(model="x", quantization="int3")
    with pytest.raises(InvalidRequestError):
        EngineConfig(model="x", quantization="int4:48")


def _copy_with_int4_cache(target, tmp_path):
    """A copy of the float checkpoint `target` with an int4 cache (as a GGUF import writes) of its linears."""
    import shutil

    folder = tmp_path / "with-cache"
    shutil.copytree(target, folder)
    linears = {name.removesuffix(".weight"): quantize_int4(t, 32) for name, t in iter_tensors(target)
               if name.endswith("_proj.weight")}
    save_int4_cache(folder, linears, source="test")
    return folder


def _interleave_shards(layer, y: torch.Tensor) -> torch.Tensor:
    """[rank 0's fused outputs | rank 1's] -> the whole layer's output order (per fused part: rank 0, rank 1)."""
    if hasattr(layer, "num_kv_heads"):  # QKV: parts q, k, v of (heads x head_dim) each, halved per rank
        q, kv = layer.num_heads * layer.head_dim // 2, layer.num_kv_heads * layer.head_dim // 2
        sizes = [q, kv, kv]
    elif hasattr(layer, "out_sizes"):
        sizes = [s // 2 for s in layer.out_sizes]
    else:
        return y
    rank_parts = [p.split(sizes, dim=1) for p in y.chunk(2, dim=1)]
    return torch.cat([rank_parts[r][i] for i in range(len(sizes)) for r in range(2)], dim=1)


@pytest.mark.parametrize("quantization", ["int4", "own"])
def test_sharded_quantized_target_equals_the_whole_one(models, tmp_path, quantization):
    """Two real ranks (worker processes) on int4 shards: greedy tokens equal the unsharded int4 model's."""
    folder = _copy_with_int4_cache(models[0], tmp_path) if quantization == "own" else models[0]
    options = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8, num_threads=1, quantization="int4")
    whole = _greedy(LLM(str(folder), **options), 4)
    with LLM(str(folder), tensor_parallel_size=2, **options) as sharded:
        assert sharded.engine.worker.quantization.is_own == (quantization == "own")
        assert _greedy(sharded, 4) == whole


def _copy_with_gguf_like_int4_cache(target, tmp_path):
    """As `_copy_with_int4_cache`, with fp16 scales and mins as a GGUF's Q4_1 blocks hold (the own CPU kernel's),
    and a Q8_0 LM head whose values the float folder's head then holds (as a GGUF import's float folder does)."""
    folder = _copy_with_int4_cache(target, tmp_path)
    linears = {}
    for name, w in load_int4_cache(folder).items():
        d = w.scales.half().float()
        linears[name] = Int4Weight(w.codes, d, (w.zeros - 8 * w.scales).half().float() + 8 * d)
    save_int4_cache(folder, linears, source="test")
    tensors = dict(iter_tensors(folder))
    head = quantize_q8_0(tensors["lm_head.weight"])
    tensors["lm_head.weight"] = head.dequantize()
    save_file(tensors, str(folder / "model.safetensors"))
    save_q8_head(folder, head, source="test")
    return folder


@pytest.mark.parametrize("which", ["sd-draft-model", "sd-eagle3", "ssd"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculation_equals_ar_on_the_own_cpu_kernels(models, tmp_path, which, batch):
    """The own kernel (float32 path) serves decode steps and verifies alike: sd and ssd == ar token for token."""
    target, draft, head = models
    folder = _copy_with_gguf_like_int4_cache(target, tmp_path)
    ar = _llm(folder, "auto")
    int4 = [m for m in ar.engine.worker.model.modules() if isinstance(m, Int4Matmul)]
    assert len(int4) == 4 * 3 and all(m.runs_own_kernel(torch.float32) for m in int4)
    assert ar.engine.worker.model.lm_head.q8_blocks is not None  # the Q8_0 head serves decode steps and verifies
    spec = {"sd-draft-model": SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3),
            "sd-eagle3": SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3),
            "ssd": SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3, ssd=SsdConfig(backup="neural"))}[which]
    llm = _llm(folder, "auto", spec)
    assert _greedy(llm, batch) == _greedy(ar, batch)
    assert llm.engine.speculative_decoder.counters.num_drafts > 0


def test_a_q8_head_that_is_not_the_float_heads_is_refused_and_not_reported(models, tmp_path):
    """A Q8_0 head cache whose values differ from the float head: the head stays float, and the scheme as applied
    (TargetInfo, the ready log) does not claim the Q8_0 head."""
    folder = _copy_with_int4_cache(models[0], tmp_path)
    save_q8_head(folder, quantize_q8_0(dict(iter_tensors(folder))["lm_head.weight"]), source="test")  # rounded
    llm = _llm(folder, "auto")
    assert llm.engine.worker.model.lm_head.q8_blocks is None
    assert not llm.engine.worker.quantization.has_q8_head
    assert "q8_0" not in llm.engine.worker.quantization.describe()


@pytest.mark.parametrize("which", ["sd-eagle3", "ssd"])
@pytest.mark.parametrize("max_num_seqs", [1, 16])  # AMX CPUs: the AVX512-BF16 loop for one sequence, tiles for 16
def test_bfloat16_greedy_speculation_equals_ar_on_the_own_bfloat16_kernels(models, tmp_path, which, max_num_seqs):
    """bfloat16 activations on the int4 and Q8_0 kernels of AVX512-BF16 CPUs: each row gets the same bits in a decode
    step and in a verify, so sd and ssd == ar token for token in bfloat16 too (elsewhere: skipped). The engine's batch
    limit picks the kernels' path (cpu_kernels.quantized_bf16_path), the same for ar and the speculating engine."""
    from ssd.layers import cpu_kernels
    from ssd_kernels.cpu import extension as own_ext

    ext = cpu_kernels.extension()
    if ext is None or own_ext.BF16_AVX512 not in own_ext.supported_paths(ext):
        pytest.skip("this CPU has no AVX512-BF16")
    target, draft, head = models
    folder = _copy_with_gguf_like_int4_cache(target, tmp_path)

    def llm(spec: SpeculationConfig | None = None) -> LLM:
        return LLM(str(folder), dtype="bfloat16", block_size=4, kv_cache_memory_mb=8, quantization="auto",
                   speculation=spec, max_num_seqs=max_num_seqs)

    ar = llm()
    int4 = [m for m in ar.engine.worker.model.modules() if isinstance(m, Int4Matmul)]
    assert int4 and all(m.own_bf16_blocks is not None and m.runs_own_kernel(torch.bfloat16) for m in int4)
    lm_head = ar.engine.worker.model.lm_head
    assert lm_head.q8_bf16_blocks is not None
    tiles = own_ext.AMX_BF16 in own_ext.supported_paths(ext) and max_num_seqs >= cpu_kernels.TILES_FROM_SEQUENCES
    path = own_ext.AMX_BF16 if tiles else own_ext.BF16_AVX512
    assert {m.own_bf16_path for m in int4} == {path} and lm_head.q8_bf16_path == path
    spec = {"sd-eagle3": SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3),
            "ssd": SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3, ssd=SsdConfig(backup="neural"))}[which]
    spec_llm = llm(spec)
    assert _greedy(spec_llm, 4) == _greedy(ar, 4)
    assert {m.own_bf16_path for m in spec_llm.engine.worker.model.modules() if isinstance(m, Int4Matmul)} == {path}
    assert spec_llm.engine.speculative_decoder.counters.num_drafts > 0
