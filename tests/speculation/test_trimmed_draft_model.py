"""A draft model whose LM head covers a trimmed vocabulary (d2t map) and whose input embedding is shared from the
target: it loads, proposes target ids, and SD / SSD stay lossless (greedy == AR in float32; sampling follows the
target's distribution: chi-square over 20,000 seeded runs on a 16-token vocabulary)."""

import json

import pytest
import torch
from safetensors import safe_open

from ssd.config import Backup, ProposerChoice, SpeculationConfig, SsdConfig, TreeShape
from ssd.errors import CheckpointError
from ssd.llm import LLM
from ssd.loader.draft_checkpoint import EMBED_KEY, SHARED_EMBEDDING
from ssd.loader.safetensors_loader import read_tensor
from ssd.sampling.params import SamplingParams
from ssd.speculation.draft_model import DraftModelProposer
from tests.speculation.exact_distribution import chi_square_pvalue, joint_distribution
from tests.tiny_models import write_tiny_checkpoint, write_trimmed_draft

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 14, 15, 9, 10, 11], [20, 21, 22, 20, 21]]
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)
KEPT = [i for i in range(96) if i % 3 != 1]  # 64 of the 96 target tokens


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("trimmed")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_trimmed_draft(draft, target, KEPT, seed=0)  # the target's own layers: accepted where argmax is kept
    return target, draft


@pytest.fixture(scope="module")
def expected(models):
    ar = LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    return [ar.generate([p], PARAMS)[0].token_ids for p in PROMPTS]


def test_loads_with_the_targets_embedding_and_its_d2t_map(models):
    target, draft = models
    proposer = DraftModelProposer(draft, "float32", 96, block_size=4, kv_cache_memory_mb=8)
    assert proposer.vocab.target_ids.tolist() == KEPT
    assert proposer.worker.model_config.output_vocab_size == len(KEPT)
    assert torch.equal(proposer.worker.model.model.embed_tokens.weight, read_tensor(target, EMBED_KEY))
    with safe_open(str(draft / "model.safetensors"), framework="pt") as f:
        assert EMBED_KEY not in f.keys() and "d2t" in f.keys()  # noqa: SIM118 - the embedding is not stored


def test_another_targets_embedding_is_refused(models, tmp_path):
    target, draft = models
    other = tmp_path / "other"
    write_tiny_checkpoint(other, "llama", seed=5)
    moved = tmp_path / "draft"
    moved.mkdir()
    config = json.loads((draft / "config.json").read_text())
    config[SHARED_EMBEDDING]["model"] = str(other)
    (moved / "config.json").write_text(json.dumps(config))
    (moved / "model.safetensors").write_bytes((draft / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="sha256"):
        DraftModelProposer(moved, "float32", 96, block_size=4, kv_cache_memory_mb=8)


@pytest.mark.parametrize("tree", [None, TreeShape(budget=8, depth=3, top_k=2)], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 3])
def test_sd_greedy_equals_ar(models, expected, tree, batch):
    spec = SpeculationConfig(ProposerChoice(str(models[1])), num_speculative_tokens=3, tree=tree)
    llm = LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)
    outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS] if batch == 1 else llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == expected
    counters = llm.engine.speculative_decoder.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens  # both accepted and rejected drafts
    said = [t for o in outs for t in o.token_ids]
    assert any(t not in KEPT for t in said)  # the target still says what the draft cannot


@pytest.mark.parametrize("batch", [1, 3])
def test_ssd_greedy_equals_ar(models, expected, batch):
    spec = SpeculationConfig(ProposerChoice(str(models[1])), num_speculative_tokens=3, ssd=SsdConfig(backup=Backup.NEURAL))
    llm = LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=16, speculation=spec)
    outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS] if batch == 1 else llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == expected
    counters = llm.engine.speculative_decoder.counters
    assert counters.num_cache_hits > 0 and counters.num_accepted_tokens > 0


NUM_RUNS = 20_000
PROMPT = [3, 7, 2, 9]
TEMP = 0.9
SAMPLING_CASES = {
    "sd-chain": None,
    "ssd-neural-saguaro": SsdConfig(backup="neural", saguaro_c=0.5),
}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("t16"), tmp_path_factory.mktemp("d12")
    hf = write_tiny_checkpoint(target, "llama", seed=0, vocab_size=16, initializer_range=0.3)
    write_trimmed_draft(draft, target, [0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15], seed=0, vocab_size=16,
                        num_hidden_layers=1, initializer_range=0.3)
    return target, draft, joint_distribution(hf.double(), PROMPT, TEMP)


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampling_matches_target_distribution(small, case):
    target, draft, exact = small
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=2, k_schedule=((1024, 2),),
                             ssd=SAMPLING_CASES[case])
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024, speculation=spec)
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True) for i in range(NUM_RUNS)]
    outs = llm.generate([PROMPT] * NUM_RUNS, params)
    counters = llm.engine.speculative_decoder.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    if SAMPLING_CASES[case] is not None:
        assert counters.num_cache_hits > 500 and counters.num_cache_misses > 1000  # both paths well exercised
    assert chi_square_pvalue([tuple(o.token_ids) for o in outs], exact) > 0.001
