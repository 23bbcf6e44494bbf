"""The target's /metrics: vLLM's engine-side series under vLLM's names and labels, read from the engine loop's
snapshot after real steps of a tiny engine (n-gram SD, prefix cache), and SSD's own series under `ssd:`."""

import asyncio
from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ssd.config import ProposerChoice, SpeculationConfig
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from target_service.engine_loop import EngineLoop
from target_service.metrics import build_registry

K = 3
VLLM_TYPES = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
              "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
              "vllm:prefix_cache_queries": "counter",
              "vllm:prefix_cache_hits": "counter", "vllm:spec_decode_num_drafts": "counter",
              "vllm:spec_decode_num_draft_tokens": "counter", "vllm:spec_decode_num_accepted_tokens": "counter",
              "vllm:spec_decode_num_accepted_tokens_per_pos": "counter"}


Scrape = dict[str, tuple[str, dict[tuple, float]]]


def scrape(engine_loop: EngineLoop) -> Scrape:
    """name -> (type, {label values (without model_name / engine): value}); counters by their _total sample."""
    text = generate_latest(build_registry(engine_loop, "tiny", K)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        values = {}
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            assert s.labels["model_name"] == "tiny" and s.labels["engine"] == "0", s
            rest = tuple(v for k, v in sorted(s.labels.items()) if k not in ("model_name", "engine"))
            values[rest] = s.value
        out[family.name] = (family.type, values)
    return out


def scrape_around(tiny_llama, work: Callable[[LLM], None]) -> tuple[LLM, Scrape, Scrape]:
    """A tiny n-gram SD engine scraped before and after `work` steps it (its loop never started)."""
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, kv_cache_memory_mb=4,
              speculation=SpeculationConfig(ProposerChoice("ngram"), num_speculative_tokens=K))
    loop = asyncio.new_event_loop()
    try:
        engine_loop = EngineLoop(llm.engine, loop)
        idle = scrape(engine_loop)
        work(llm)
        engine_loop._publish_load()
        return llm, idle, scrape(engine_loop)
    finally:
        loop.close()


def test_series_follow_the_engine(tiny_llama) -> None:
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # repeats: the n-gram drafts and hits
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    # the same prompt twice: the second time 16 of its 18 tokens come from the prefix cache
    llm, idle, busy = scrape_around(tiny_llama, lambda llm: (llm.generate([prompt], params),
                                                             llm.generate([prompt], params)))
    assert {name: kind for name, (kind, _) in idle.items() if name in VLLM_TYPES} == VLLM_TYPES
    assert idle["vllm:spec_decode_num_accepted_tokens_per_pos"][1] == {("0",): 0, ("1",): 0, ("2",): 0}
    assert idle["vllm:kv_cache_usage_perc"][1] == {(): 0.0}
    counters = llm.engine.speculative_decoder.counters
    assert busy["vllm:prefix_cache_queries"][1] == {(): 2 * len(prompt)}
    assert busy["vllm:prefix_cache_hits"][1] == {(): 16}
    assert busy["vllm:spec_decode_num_drafts"][1] == {(): counters.num_drafts} and counters.num_drafts > 0
    assert busy["vllm:spec_decode_num_draft_tokens"][1] == {(): counters.num_draft_tokens}
    assert busy["vllm:spec_decode_num_accepted_tokens"][1] == {(): counters.num_accepted_tokens}
    per_pos = busy["vllm:spec_decode_num_accepted_tokens_per_pos"][1]
    assert per_pos[("0",)] >= per_pos[("1",)] >= per_pos[("2",)]
    assert sum(per_pos.values()) == counters.num_accepted_tokens  # position j counts rounds accepting > j
    assert busy["ssd:spec_decode_rounds"][1][()] == counters.num_rounds > 0
    assert busy["ssd:spec_decode_verify_seconds"][1][()] > 0
    assert busy["vllm:num_requests_running"][1] == {(): 0}  # both finished


def test_adaptive_choices_are_exported(tiny_llama) -> None:
    """Adaptive requests: the mode chooser's steps per choice and its switches reach /metrics."""
    params = SamplingParams(max_tokens=12, ignore_eos=True, adaptive=True)
    llm, idle, busy = scrape_around(tiny_llama, lambda llm: llm.generate([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]], params))
    assert idle["ssd:adaptive_rounds"] == ("counter", {("plain",): 0, ("speculate",): 0, ("sd",): 0})
    chooser = llm.engine.mode_chooser
    rounds = busy["ssd:adaptive_rounds"][1]
    assert rounds == {(c,): chooser.num_rounds[c] for c in ("plain", "speculate", "sd")}
    assert rounds[("sd",)] == 0  # offered to ssd sequences only
    assert rounds[("plain",)] > 0 and rounds[("speculate",)] > 0  # both choices are measured first
    assert busy["ssd:adaptive_switches"][1] == {(): chooser.num_switches} and chooser.num_switches >= 1
    assert busy["ssd:adaptive_draft_waits"][1] == {(): chooser.num_draft_waits}
