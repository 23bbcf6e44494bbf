"""The gateway's Prometheus metrics, in a registry of its own (no global state).

Latencies and token counters are measured here; running / waiting / KV use come from the
replicas' last GetLoad at scrape time; speculation counters from per-request stats; the admission
queue's counts at scrape time.
"""

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from gateway.admission import Admission
from gateway.router import Router

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _ReplicaLoadCollector:
    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self):  # noqa: ANN201 - prometheus collector protocol
        running = GaugeMetricFamily("ssd_requests_running", "Requests being decoded", labels=["replica"])
        waiting = GaugeMetricFamily("ssd_requests_waiting", "Requests waiting for admission", labels=["replica"])
        kv = GaugeMetricFamily("ssd_kv_cache_usage_ratio", "Fraction of KV blocks in use", labels=["replica"])
        healthy = GaugeMetricFamily("ssd_replica_healthy", "1 if the replica is serving", labels=["replica"])
        for r in self.router.replicas:
            running.add_metric([r.address], r.load.num_running)
            waiting.add_metric([r.address], r.load.num_waiting)
            kv.add_metric([r.address], r.load.num_used_kv_blocks / r.load.num_kv_blocks if r.load.num_kv_blocks else 0.0)
            healthy.add_metric([r.address], 1.0 if r.is_healthy else 0.0)
        yield from (running, waiting, kv, healthy)


class _AdmissionCollector:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self):  # noqa: ANN201 - prometheus collector protocol
        yield GaugeMetricFamily("ssd_gateway_requests_in_flight", "Requests holding an admission slot",
                                value=self.admission.num_in_flight)
        yield GaugeMetricFamily("ssd_gateway_requests_waiting", "Requests waiting for an admission slot",
                                value=self.admission.num_waiting)


class GatewayMetrics:
    def __init__(self, router: Router) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("ssd_time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.itl = Histogram("ssd_inter_token_latency_seconds", "Time between streamed tokens", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.e2e = Histogram("ssd_e2e_request_latency_seconds", "Request latency, end to end", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.prompt_tokens = Counter("ssd_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("ssd_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("ssd_requests", "Finished requests", ["finish_reason"], registry=r)
        self.errors = Counter("ssd_request_errors", "Failed requests", ["code"], registry=r)
        self.retries = Counter("ssd_request_retries", "Requests retried on another replica", registry=r)
        self.spec_drafts = Counter("ssd_spec_decode_num_drafts", "Speculation rounds", registry=r)
        self.spec_draft_tokens = Counter("ssd_spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.spec_accepted = Counter("ssd_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.spec_hits = Counter("ssd_spec_decode_cache_hits", "Speculation cache hits (SSD)", registry=r)
        self.spec_misses = Counter("ssd_spec_decode_cache_misses", "Speculation cache misses (SSD)", registry=r)
        self.rejected = Counter("ssd_gateway_rejected_requests", "Requests refused by admission (429 / "
                                "RESOURCE_EXHAUSTED, or past their deadline while waiting)", ["reason"], registry=r)
        self.constrained = Counter("ssd_structured_output_requests", "Requests held to a grammar (structured "
                                   "output; named and required tool calls count as json_schema)", ["grammar"],
                                   registry=r)
        r.register(_ReplicaLoadCollector(router))

    def watch(self, admission: Admission) -> None:
        """Export the admission queue's in-flight and waiting counts, and count its refusals."""
        self.registry.register(_AdmissionCollector(admission))
        admission.on_reject = lambda reason: self.rejected.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
