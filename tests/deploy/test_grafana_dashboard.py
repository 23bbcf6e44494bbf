"""The shipped Grafana dashboard queries only series the services export (their registries, scraped here
without a model), so a renamed metric cannot leave a panel silently empty."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from draft_service.config import DraftServiceConfig
from draft_service.metrics import build_registry as draft_registry
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer
from gateway.metrics import GatewayMetrics
from target_service.engine_loop import LoadSnapshot
from target_service.metrics import build_registry as target_registry

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ssd-serve-dashboard.json"
SERIES = re.compile(r"\b((?:vllm|ssd):[a-z0-9_]+)")


def exported_samples() -> set[str]:
    """Every sample name the target, draft and gateway export (histograms' _bucket / _sum / _count included)."""
    router = SimpleNamespace(replicas=[], info=lambda: SimpleNamespace(model_name="m"))
    servicer = SpeculatorServicer(build_service_proposer(DraftServiceConfig()), "ngram")
    try:
        pages = [generate_latest(target_registry(SimpleNamespace(load=LoadSnapshot()), "m", 3)),
                 generate_latest(draft_registry(servicer)), GatewayMetrics(router).render()]
    finally:
        servicer.worker.close()
    return {s.name for page in pages for f in text_string_to_metric_families(page.decode()) for s in f.samples}


def test_every_query_names_an_exported_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    named = {name for expr in exprs for name in SERIES.findall(expr)}
    assert len(exprs) > 20 and named
    assert named <= exported_samples(), named - exported_samples()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    vllm = {name for name in named if name.startswith("vllm:")}
    for family in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                   "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_hits",
                   "spec_decode_num_accepted_tokens_per_pos"):
        assert any(name.startswith("vllm:" + family) for name in vllm), family
