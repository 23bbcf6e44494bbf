"""The engine on a CUDA GPU (tiny random float32 models): greedy AR on cuda == on cpu; SD and SSD with a draft
model and with an EAGLE-3 head == AR; seeded sampling runs; logits come back on CPU, target features stay on
the GPU. Skipped without a GPU, except the check that asking for cuda there is a clear error."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.context import ForwardMode
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.runtime.model_runner import ForwardItem
from ssd.sampling.params import SamplingParams
from tests.speculation.test_eagle3_sd import tiny_target_draft_and_head

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 14, 15, 9], [20, 21, 22], [30, 31, 32, 33, 34, 35]]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
TREE = TreeShape(budget=8, depth=3, top_k=2)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error(tiny_llama):
    with pytest.raises(InvalidRequestError, match="no CUDA GPU"):
        LLM(str(tiny_llama), dtype="float32", device="cuda")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    target, draft, head = tiny_target_draft_and_head(tmp_path_factory)
    return {"target": target, "self": target, "draft": draft, "eagle3": head}


def _llm(folders, device: str, draft: str | None = None, **spec) -> LLM:
    speculation = SpeculationConfig(ProposerChoice(str(folders[draft])), num_speculative_tokens=3, **spec) if draft else None
    return LLM(str(folders["target"]), dtype="float32", block_size=4, kv_cache_memory_mb=8, device=device,
               speculation=speculation)


@pytest.fixture(scope="module")
def cuda_ar(folders):
    """Greedy AR tokens on the GPU, one prompt at a time."""
    llm = _llm(folders, "cuda")
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@needs_cuda
def test_greedy_ar_on_cuda_equals_cpu(folders, cuda_ar):
    cpu = _llm(folders, "cpu").generate(PROMPTS, GREEDY)
    cuda = _llm(folders, "cuda").generate(PROMPTS, GREEDY)  # a batch of several
    assert [o.token_ids for o in cpu] == cuda_ar
    assert [o.token_ids for o in cuda] == cuda_ar


@needs_cuda
@pytest.mark.parametrize("draft", ["draft", "eagle3"])
@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_sd_on_cuda_equals_ar(folders, cuda_ar, draft, tree):
    llm = _llm(folders, "cuda", draft, tree=tree)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == cuda_ar
    assert llm.engine.speculative_decoder.counters.num_drafts > 0
    proposer = llm.engine.speculative_decoder.proposer
    model = proposer.head if draft == "eagle3" else proposer.worker.model
    assert next(model.parameters()).device.type == "cuda"


@needs_cuda
@pytest.mark.parametrize("draft", ["self", "draft", "eagle3"])
def test_greedy_ssd_on_cuda_equals_ar(folders, cuda_ar, draft):
    llm = _llm(folders, "cuda", draft, ssd=SsdConfig())
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == cuda_ar
    counters = llm.engine.speculative_decoder.counters
    assert counters.num_drafts > 0
    if draft == "self":  # a perfect draft: its own argmax bonus is always cached
        assert counters.num_cache_hits > 0


@needs_cuda
@pytest.mark.parametrize("draft, spec", [(None, {}), ("draft", {}), ("eagle3", {}), ("eagle3", {"tree": TREE}),
                                         ("draft", {"ssd": SsdConfig(saguaro_c=0.5)}),
                                         ("eagle3", {"ssd": SsdConfig(saguaro_c=0.5)})],
                         ids=["ar", "sd-draft", "sd-eagle3", "sd-eagle3-tree", "ssd-draft", "ssd-eagle3"])
def test_seeded_sampling_runs_on_cuda(folders, draft, spec):
    llm = _llm(folders, "cuda", draft, **spec)
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=20, ignore_eos=True) for i in range(len(PROMPTS))]
    outs = llm.generate(PROMPTS, params)
    assert [len(o.token_ids) for o in outs] == [20] * len(PROMPTS)
    assert all(0 <= t < 96 for o in outs for t in o.token_ids)


@needs_cuda
def test_logits_come_back_on_cpu_and_features_stay_on_the_gpu(folders):
    llm = _llm(folders, "cuda", "eagle3")
    runner = llm.engine.runner
    out = runner.forward([ForwardItem([5, 6, 7, 8, 9], 0, [0, 1], num_logits=2)], ForwardMode.PREFILL,
                         aux_layers=llm.engine.speculative_decoder.feature_layers)
    assert out.logits.device.type == "cpu" and out.logits.dtype == torch.float32 and out.logits.shape == (2, 96)
    assert out.aux_hidden is not None and out.aux_hidden.device == runner.device
    assert runner.device.type == "cuda" and out.aux_hidden.shape == (5, 3 * 64)


@needs_cuda
def test_a_cuda_index_out_of_range_is_a_clear_error(folders):
    with pytest.raises(InvalidRequestError, match="does not exist"):
        _llm(folders, f"cuda:{torch.cuda.device_count()}")
