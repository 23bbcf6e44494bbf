"""SSD in one process (answer, then build at once): greedy output == AR token for token, for a draft model
and an EAGLE-3 head, batch 1 and 4, every fan-out and backup kind; the cache really hits."""

import pytest

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig
from ssd.llm import LLM
from tests.speculation.test_eagle3_sd import tiny_target_draft_and_head
from tests.speculation.test_sd_greedy import PARAMS, PROMPTS


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target, other, head = tiny_target_draft_and_head(tmp_path_factory)
    ar = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    expected = [ar.generate([p], PARAMS)[0].token_ids for p in PROMPTS]
    return {"self": target, "other": other, "eagle3": head}, expected


def _llm(models, which: str, ssd: SsdConfig, k: int = 3) -> LLM:
    drafts, _ = models
    spec = SpeculationConfig(ProposerChoice(str(drafts[which])), num_speculative_tokens=k, ssd=ssd)
    return LLM(str(drafts["self"]), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)


@pytest.mark.parametrize("which", ["self", "other", "eagle3"])
# the budgets pinned (fit_fan_out=False: the perfect draft's hit counts below depend on them), and the default (fitted)
@pytest.mark.parametrize("ssd", [SsdConfig(fit_fan_out=False),
                                 SsdConfig(fan_out="uniform", backup="fast", fan_out_budget=5, fit_fan_out=False),
                                 SsdConfig(backup="neural", fan_out_budget=1, fit_fan_out=False), SsdConfig()],
                         ids=["geometric", "uniform-fast", "f1", "fitted"])
@pytest.mark.parametrize("batch", [1, 4])
def test_ssd_greedy_equals_ar(models, which, ssd, batch):
    llm = _llm(models, which, ssd)
    outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS] if batch == 1 else llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == models[1]
    counters = llm.engine.speculative_decoder.counters
    assert counters.num_cache_misses >= len(PROMPTS)  # every sequence's first round misses
    if which == "self" and not ssd.fit_fan_out:  # a perfect draft: all accepted, the bonus (its argmax) cached
        assert counters.num_accepted_tokens == counters.num_draft_tokens
        assert counters.num_cache_hits == counters.num_drafts - counters.num_cache_misses > 0
        if ssd.fan_out_budget >= 4:  # enough guesses to cover j = K after a miss too
            assert counters.num_cache_misses == len(PROMPTS)
    assert all(o.spec is not None and o.spec.num_cache_lookups > 0 for o in outs)  # SSD rounds were counted


def test_ssd_counters_and_draft_timings(models):
    llm = _llm(models, "self", SsdConfig())
    llm.generate(PROMPTS, PARAMS)
    draft = llm.engine.speculative_decoder.proposer.counters  # SsdCounters: the draft side's own count
    assert draft.num_hits > 0 and draft.num_builds > 0 and draft.build_s > 0
    assert 0 < draft.predicted_hits / draft.num_predicted <= 1
    target = llm.engine.speculative_decoder.counters
    assert target.tokens_per_round_hit == 4.0  # K=3 all accepted + bonus
    assert target.cache_hit_rate == draft.num_hits / (draft.num_hits + draft.num_misses)


def test_ssd_backup_hits_redrafts_the_hits_of_a_round_that_missed(models):
    """backup_hits: a round with a neural backup drafts its hits afresh too; greedy output unchanged."""
    llm = _llm(models, "other", SsdConfig(backup="neural", backup_hits=True, round_hit_floor=0.0))
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == models[1]
    draft = llm.engine.speculative_decoder.proposer.counters
    target = llm.engine.speculative_decoder.counters
    assert draft.num_neural_backups > draft.num_misses  # some hits rode along in a backup
    assert target.num_cache_hits < draft.num_hits  # ... and were verified as backups
