"""Greedy losslessness of synchronous speculative decoding: SD output == AR output, token for token."""

import pytest

from ssd.config import ProposerChoice, SpeculationConfig, TreeShape
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
    [9, 10, 11, 12, 13, 14, 15, 9, 10, 11],
    [20, 21, 22, 20, 21],
    [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 30, 31],
]
PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = tmp_path_factory.mktemp("target")
    other = tmp_path_factory.mktemp("draft")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_checkpoint(other, "llama", seed=1, num_hidden_layers=1)
    return target, other


@pytest.fixture(scope="module")
def expected(models):
    ar = LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    return [ar.generate([p], PARAMS)[0].token_ids for p in PROMPTS]


def _draft(models, which):
    return {"self": str(models[0]), "other": str(models[1]), "ngram": "ngram"}[which]


@pytest.mark.parametrize("which", ["self", "other", "ngram"])
@pytest.mark.parametrize("tree", [None, TreeShape(budget=8, depth=3, top_k=2)], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_sd_greedy_equals_ar(models, expected, which, tree, batch):
    spec = SpeculationConfig(ProposerChoice(_draft(models, which)), num_speculative_tokens=3, tree=tree)
    llm = LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)
    if batch == 1:
        outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS]
    else:
        outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == expected
    counters = llm.engine.speculative_decoder.counters
    assert counters.num_drafts > 0
    if which == "self" and tree is None:  # a perfect draft: everything proposed is accepted
        assert counters.num_accepted_tokens == counters.num_draft_tokens > 0
    if which == "self" and tree is not None:  # the argmax child always exists at depth 1
        assert counters.accepted_per_position[0] == counters.num_drafts
    assert all(o.spec is not None and o.spec.num_drafts > 0 for o in outs)
