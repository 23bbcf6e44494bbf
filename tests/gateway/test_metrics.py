"""The gateway's /metrics: vLLM's request-level series, names, types, buckets and `model_name` label, present
at zero for the served model before its first request; the gateway's own `ssd_*` series beside them."""

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), written out here again so a change to ours shows
VLLM_BUCKETS = {
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
}


@dataclass
class _Info:
    model_name: str


@dataclass
class _Router:
    replicas: list = field(default_factory=list)
    known: _Info | None = None

    def info(self) -> _Info | None:
        return self.known


def families(metrics: GatewayMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_the_served_models_series_exist_at_zero_with_vllms_buckets() -> None:
    router = _Router()
    metrics = GatewayMetrics(router)
    before = families(metrics)
    assert before["vllm:time_to_first_token_seconds"].samples == []  # no model known yet: no series
    router.known = _Info("smollm2-135m-instruct")
    found = families(metrics)
    for name, bounds in VLLM_BUCKETS.items():
        assert found[name].type == "histogram"
        buckets = [s for s in found[name].samples if s.name.endswith("_bucket")]
        assert [float(s.labels["le"]) for s in buckets] == [*bounds, float("inf")], name
        assert all(s.labels["model_name"] == "smollm2-135m-instruct" and s.value == 0 for s in buckets)
    for name in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"):
        assert found[name].type == "counter", name
    reasons = {s.labels["finished_reason"] for s in found["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort"}


def test_observations_land_under_the_model_name() -> None:
    metrics = GatewayMetrics(_Router(), served_model_name="served")
    series = metrics.for_model("served")
    series.ttft.observe(0.03)
    series.prompt_tokens.inc(7)
    series.success["length"].inc()
    found = families(metrics)
    ttft = {s.labels["le"]: s.value for s in found["vllm:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")}
    assert ttft["0.02"] == 0 and ttft["0.04"] == 1
    prompt = next(s for s in found["vllm:prompt_tokens"].samples if s.name.endswith("_total"))
    assert prompt.labels == {"model_name": "served"} and prompt.value == 7
    success = {s.labels["finished_reason"]: s.value for s in found["vllm:request_success"].samples
               if s.name.endswith("_total")}
    assert success == {"stop": 0, "length": 1, "abort": 0}
    assert "ssd_replica_healthy" in found and "ssd_request_retries" in found
