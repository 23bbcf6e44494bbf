"""The gateway's Prometheus metrics, in a registry of its own (no global state).

The gateway is vLLM's API frontend: it exports vLLM's request-level series under vLLM's names, types, buckets
and `model_name` label (latencies as the client sees them, prompt / generation tokens, finished requests), so
vLLM's dashboards and routers read them unchanged. The engine-side series (running / waiting, KV use, prefix
cache, speculative decoding) are the targets' own (target_service/metrics.py), scraped from each target, so
nothing is counted twice. The gateway's own counters (`ssd_*`: replica health, admission, retries, errors,
grammars) stay under their names.
"""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from gateway.admission import Admission
from gateway.router import Router

# vLLM's buckets (vllm/v1/metrics/loggers.py), so its dashboards' quantiles read the same
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's 1-2-5 series for token counts; vLLM stops it at max_model_len, known here only once a target answers
TOKEN_BUCKETS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))
FINISH_REASONS = ("stop", "length", "abort")  # vLLM's finished_reason values, and ours


class _ReplicaHealthCollector:
    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self):  # noqa: ANN201 - prometheus collector protocol
        healthy = GaugeMetricFamily("ssd_replica_healthy", "1 if the replica is serving", labels=["replica"])
        for r in self.router.replicas:
            healthy.add_metric([r.address], 1.0 if r.is_healthy else 0.0)
        yield healthy


class _AdmissionCollector:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self):  # noqa: ANN201 - prometheus collector protocol
        yield GaugeMetricFamily("ssd_gateway_requests_in_flight", "Requests holding an admission slot",
                                value=self.admission.num_in_flight)
        yield GaugeMetricFamily("ssd_gateway_requests_waiting", "Requests waiting for an admission slot",
                                value=self.admission.num_waiting)


@dataclass(frozen=True)
class ModelSeries:
    """One served model's request-level series (the metrics bound to its `model_name`)."""

    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    request_prompt_tokens: Histogram
    request_generation_tokens: Histogram
    request_max_tokens: Histogram
    success: dict[str, Counter]  # finished_reason -> counter


class GatewayMetrics:
    def __init__(self, router: Router, served_model_name: str | None = None) -> None:
        self.router = router
        self.served_model_name = served_model_name  # the config's name; else the targets' (TargetInfo)
        self.registry = CollectorRegistry()
        r = self.registry
        label = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              label, registry=r, buckets=TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             label, registry=r, buckets=ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             label, registry=r, buckets=REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", label, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", label,
                                         registry=r)
        self.request_prompt_tokens = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               label, registry=r, buckets=TOKEN_BUCKETS)
        self.request_generation_tokens = Histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", label, registry=r,
                                                   buckets=TOKEN_BUCKETS)
        self.request_max_tokens = Histogram("vllm:request_params_max_tokens",
                                            "Histogram of the max_tokens request parameter.", label, registry=r,
                                            buckets=TOKEN_BUCKETS)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*label, "finished_reason"], registry=r)
        self.errors = Counter("ssd_request_errors", "Failed requests", ["code"], registry=r)
        self.retries = Counter("ssd_request_retries", "Requests retried on another replica", registry=r)
        self.rejected = Counter("ssd_gateway_rejected_requests", "Requests refused by admission (429 / "
                                "RESOURCE_EXHAUSTED, or past their deadline while waiting)", ["reason"], registry=r)
        self.constrained = Counter("ssd_structured_output_requests", "Requests held to a grammar (structured "
                                   "output; named and required tool calls count as json_schema)", ["grammar"],
                                   registry=r)
        r.register(_ReplicaHealthCollector(router))

    @property
    def model_name(self) -> str | None:
        """The served model's name; None until a target has answered (and the config names none)."""
        info = self.router.info()
        return self.served_model_name or (info.model_name if info is not None else None)

    def for_model(self, model_name: str) -> ModelSeries:
        """The series labelled `model_name` (made at zero on first use, as vLLM makes them at start-up)."""
        return ModelSeries(self.ttft.labels(model_name), self.itl.labels(model_name), self.e2e.labels(model_name),
                           self.prompt_tokens.labels(model_name), self.generation_tokens.labels(model_name),
                           self.request_prompt_tokens.labels(model_name),
                           self.request_generation_tokens.labels(model_name),
                           self.request_max_tokens.labels(model_name),
                           {reason: self.success.labels(model_name, reason) for reason in FINISH_REASONS})

    def watch(self, admission: Admission) -> None:
        """Export the admission queue's in-flight and waiting counts, and count its refusals."""
        self.registry.register(_AdmissionCollector(admission))
        admission.on_reject = lambda reason: self.rejected.labels(reason).inc()

    def render(self) -> bytes:
        if self.model_name is not None:
            self.for_model(self.model_name)  # the served model's series exist (at zero) before its first request
        return generate_latest(self.registry)
