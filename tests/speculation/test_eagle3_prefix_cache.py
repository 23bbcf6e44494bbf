"""Prefix caching with an EAGLE-3 head: a prompt whose first blocks the prefix cache serves still hands the head
the target features of every position (kept beside the KV), so drafting and output are what they are without it."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, TreeShape
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.speculation.test_eagle3_sd import tiny_target_and_head

SHARED = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # 18 tokens: 4 full blocks of 4
TURNS = [SHARED + [30, 31], SHARED + [40, 41, 42, 43, 44, 45]]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


def _llm(folders, is_prefix_caching: bool, tree: TreeShape | None = None) -> LLM:
    target, head = folders
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3, tree=tree)
    return LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec,
               enable_prefix_caching=is_prefix_caching)


def _record_features(llm: LLM) -> dict[int, list[tuple[int, torch.Tensor]]]:
    """Wrap the proposer so every (features_start, features) it receives is kept, per sequence."""
    log: dict[int, list[tuple[int, torch.Tensor]]] = {}
    proposer = llm.engine.speculative_decoder.proposer
    propose = proposer.propose

    def recording(requests):  # noqa: ANN001, ANN202
        for r in requests:
            if r.features is not None:
                log.setdefault(r.seq_id, []).append((r.features_start, r.features.clone()))
        return propose(requests)

    proposer.propose = recording
    return log


def _feature_log(pieces: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """The features a sequence was given, position by position ([n, F]; later pieces overwrite earlier)."""
    rows: dict[int, torch.Tensor] = {}
    for start, feats in pieces:
        for i, row in enumerate(feats):
            rows[start + i] = row
    assert sorted(rows) == list(range(len(rows))), "the proposer missed some positions' features"
    return torch.stack([rows[i] for i in range(len(rows))])


@pytest.mark.parametrize("tree", [None, TreeShape(budget=6, depth=3, top_k=2)], ids=["chain", "tree"])
def test_prefix_hits_keep_eagle3_greedy_output_and_features(folders, tree):
    cached, uncached = _llm(folders, True, tree), _llm(folders, False, tree)
    assert cached.engine.block_manager.enable_prefix_caching  # no longer turned off for a head that needs features
    logs = _record_features(cached), _record_features(uncached)
    results = []
    for llm in (cached, uncached):
        first = llm.generate([TURNS[0]], PARAMS)[0]
        follow_up = TURNS[0] + first.token_ids + [50]  # a next chat turn: the answer's features come from the cache
        results.append([first, llm.generate([TURNS[1]], PARAMS)[0], llm.generate([follow_up], PARAMS)[0]])
    assert [r.token_ids for r in results[0]] == [r.token_ids for r in results[1]]
    hits = [r.num_cached_prompt_tokens for r in results[0]]
    assert hits[:2] == [0, 16]  # the shared full blocks of the prompt
    assert hits[2] == 28  # 7 full blocks: the first prompt and its answer (all but the last token's KV)
    assert all(r.num_cached_prompt_tokens == 0 for r in results[1])
    for seq_cached, seq_uncached in zip(sorted(logs[0]), sorted(logs[1]), strict=True):
        torch.testing.assert_close(_feature_log(logs[0][seq_cached]), _feature_log(logs[1][seq_uncached]),
                                   rtol=1e-4, atol=1e-4)
    drafted = [llm.engine.speculative_decoder.counters for llm in (cached, uncached)]
    assert drafted[0].num_accepted_tokens == drafted[1].num_accepted_tokens  # the head drafted the same tokens


def test_prefix_hits_with_eagle3_equal_plain_decoding(folders):
    target, _ = folders
    ar = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    expected = [ar.generate([p], PARAMS)[0].token_ids for p in TURNS]
    sd = _llm(folders, True)
    sd.generate(TURNS, PARAMS)  # a batch: fills the cache
    again = [sd.generate([p], PARAMS)[0] for p in TURNS]
    assert [r.token_ids for r in again] == expected
    assert [r.num_cached_prompt_tokens for r in again] == [16, 20]  # all but the last prompt token, in full blocks
