"""The draft's /metrics: vLLM's names under the draft's model_name, SSD's cache answers and build time under
`ssd:`, read from the servicer's counters at scrape time (a neural draft, and n-gram without KV)."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.metrics import build_registry
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer

TYPES = {"vllm:num_requests_running": "gauge", "vllm:kv_cache_usage_perc": "gauge",
         "vllm:generation_tokens": "counter", "ssd:draft_sessions": "gauge", "ssd:draft_speculations": "counter",
         "ssd:speculation_cache_hits": "counter", "ssd:speculation_cache_misses": "counter",
         "ssd:speculation_backups": "counter", "ssd:speculation_cache_build_seconds": "counter",
         "ssd:draft_catch_ups": "counter", "ssd:draft_catch_up_tokens": "counter"}


def scrape(servicer: SpeculatorServicer, name: str) -> dict[str, tuple[str, dict[tuple, float]]]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(build_registry(servicer)).decode()):
        values = {}
        for s in family.samples:
            assert s.labels["model_name"] == name and s.labels["engine"] == "0", s
            values[tuple(v for k, v in sorted(s.labels.items()) if k not in ("model_name", "engine"))] = s.value
        out[family.name] = (family.type, values)
    return out


def test_a_neural_drafts_series_follow_its_counters(tiny_llama) -> None:
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(tiny_llama), kv_cache_memory_mb=8)))
    servicer = SpeculatorServicer(draft, "tiny-draft")
    try:
        idle = scrape(servicer, "tiny-draft")
        assert {name: kind for name, (kind, _) in idle.items() if name in TYPES} == TYPES
        assert idle["vllm:generation_tokens"][1] == {(): 0} and idle["vllm:kv_cache_usage_perc"][1] == {(): 0.0}
        assert idle["ssd:speculation_backups"][1] == {("fast",): 0, ("neural",): 0}
        servicer.counters.record(3, 0, 0)
        servicer.counters.record(2, 0, 0)
        servicer.ssd.counters.num_hits, servicer.ssd.counters.num_neural_backups = 4, 1
        servicer.ssd.counters.build_s = 0.25
        servicer.num_catch_ups, servicer.num_catch_up_tokens = 2, 7
        busy = scrape(servicer, "tiny-draft")
    finally:
        servicer.worker.close()
    assert busy["vllm:generation_tokens"][1] == {(): 5}
    assert busy["ssd:draft_speculations"][1] == {(): 2}
    assert busy["ssd:speculation_cache_hits"][1] == {(): 4}
    assert busy["ssd:speculation_backups"][1] == {("fast",): 0, ("neural",): 1}
    assert busy["ssd:speculation_cache_build_seconds"][1] == {(): 0.25}
    assert busy["ssd:draft_catch_ups"][1] == {(): 2} and busy["ssd:draft_catch_up_tokens"][1] == {(): 7}


def test_an_ngram_draft_has_no_kv() -> None:
    servicer = SpeculatorServicer(build_service_proposer(DraftServiceConfig()), "ngram")
    try:
        series = scrape(servicer, "ngram")
    finally:
        servicer.worker.close()
    assert series["vllm:kv_cache_usage_perc"][1] == {(): 0.0}
    assert series["vllm:num_requests_running"][1] == {(): 0}
