"""The EAGLE-3 head's own prefix cache: a second chat turn starts from the head blocks of the first, computes fewer
head positions, and gives the same greedy output as without the cache (and as plain decoding)."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig
from ssd.llm import LLM
from ssd.models.eagle3 import HeadKVCache
from ssd.speculation.head_prefix_cache import HeadPrefixCache
from tests.speculation.test_eagle3_prefix_cache import PARAMS, TURNS
from tests.speculation.test_eagle3_sd import tiny_target_and_head


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


def _llm(folders, head_cache: bool) -> LLM:
    target, head = folders
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3)
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)
    if not head_cache:
        llm.engine.speculative_decoder.proposer.prefix_cache = None
    return llm


def _turns(llm: LLM) -> tuple[list[list[int]], list[int]]:
    """Two chat turns (the second extends the first and its answer): their tokens, and the head positions each
    computed."""
    proposer = llm.engine.speculative_decoder.proposer
    outputs, computed = [], []
    for prompt in (TURNS[0], None):
        before = proposer.num_head_positions
        prompt = prompt if prompt is not None else TURNS[0] + outputs[0] + [50]
        outputs.append(llm.generate([prompt], PARAMS)[0].token_ids)
        computed.append(proposer.num_head_positions - before)
    return outputs, computed


def test_a_second_turn_reuses_the_head_blocks_and_keeps_greedy_output(folders):
    target, _ = folders
    (cached, cached_positions), (uncached, uncached_positions) = _turns(_llm(folders, True)), _turns(
        _llm(folders, False))
    ar = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    follow_up = TURNS[0] + ar.generate([TURNS[0]], PARAMS)[0].token_ids + [50]
    assert cached == uncached == [ar.generate([p], PARAMS)[0].token_ids for p in (TURNS[0], follow_up)]
    assert cached_positions[0] == uncached_positions[0]  # nothing cached yet
    # turn 2: 28 of its 33 prompt tokens hit (7 blocks of 4): head positions 0..26 come from the cache
    assert cached_positions[1] == uncached_positions[1] - 27


def test_lookup_needs_every_token_of_a_block_and_evicts_lru():
    cache = HeadPrefixCache(block_size=4, capacity=2)
    kv = HeadKVCache(1, 2)
    kv.append(torch.randn(11, 1, 2), torch.randn(11, 1, 2))
    fused = torch.randn(11, 3)  # [positions, d]
    tokens = list(range(12))
    cache.insert(tokens, 11, kv, fused)  # head blocks 0..2 end at positions 3, 7, 11: all complete
    assert len(cache.blocks) == 2  # capacity 2: block 0 went first (LRU)
    assert cache.lookup(tokens, 11) == []  # block 0 missing: no prefix at all
    cache = HeadPrefixCache(block_size=4, capacity=8)
    cache.insert(tokens, 10, kv, fused)  # head position 10 not real yet: blocks 0, 1 only
    assert len(cache.blocks) == 2
    found = cache.lookup(tokens[:8] + [99], 11)
    assert len(found) == 2
    restored = HeadKVCache(1, 2)
    torch.testing.assert_close(cache.restore(found, restored), fused[:7])
    torch.testing.assert_close(restored.k[:7], kv.k[:7])
    assert cache.lookup([0, 1, 2, 99, 4, 5, 6, 7], 11) == []  # another first block
    assert len(cache.lookup(tokens, 6)) == 1  # at most 6 positions: block 0 (0..2) fits, block 1 (3..6) not
    assert cache.counters.num_hit_positions == 7 + 3
