"""The target's Prometheus metrics: the engine-side series of vLLM, under vLLM's names, plus SSD's own (`ssd:`).

vLLM splits its metrics between the engine core (scheduler state, KV, prefix cache, speculative decoding) and
the API frontend (latencies, token counts, finished requests). Here the target is the engine core and the
gateway the frontend (gateway/metrics.py), so no series is counted twice when both are scraped. Every value is
read at scrape time from the engine loop's last published snapshot (no state of its own, no engine access).
"""

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rpc.metrics_http import ENGINE_INDEX, METRICS_LABELS
from ssd.engine.mode_choice import CHOICES
from ssd.speculation.speculation_stats import SpecStats
from target_service.engine_loop import EngineLoop, LoadSnapshot


class _EngineCollector:
    def __init__(self, engine_loop: EngineLoop, model_name: str, num_speculative_tokens: int,
                 is_draft_connected: Callable[[], bool]) -> None:
        self.engine_loop = engine_loop
        self.labels = [model_name, ENGINE_INDEX]
        self.num_speculative_tokens = num_speculative_tokens  # positions exported even before any accept
        self.is_draft_connected = is_draft_connected

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=METRICS_LABELS)
        g.add_metric(self.labels, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=METRICS_LABELS)
        c.add_metric(self.labels, value)
        return c

    def collect(self) -> Iterator[Metric]:
        s = self.engine_loop.load
        yield from self._scheduler(s)
        spec = s.spec if s.spec is not None else SpecStats()
        yield from self._spec_decode(spec)
        yield from self._ssd(spec)
        yield from self._adaptive(s)
        yield self._gauge("ssd:draft_connected", "1 while the target's draft session is up", self.is_draft_connected())

    def _scheduler(self, s: LoadSnapshot) -> Iterator[Metric]:
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          s.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        usage = s.num_used_kv_blocks / s.num_kv_blocks if s.num_kv_blocks else 0.0
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        yield self._gauge("vllm:gpu_cache_usage_perc",  # vLLM's older name, which older routers still read
                          "KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc "
                          "instead.", usage)
        yield self._counter("vllm:prefix_cache_queries",
                            "Prefix cache queries, in terms of number of queried tokens.", s.num_prefix_queried_tokens)
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            s.num_prefix_hit_tokens)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            s.num_preemptions)

    def _spec_decode(self, c: SpecStats) -> Iterator[Metric]:
        yield self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", c.num_drafts)
        yield self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", c.num_draft_tokens)
        yield self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                            c.num_accepted_tokens)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=[*METRICS_LABELS, "position"])
        accepted = c.accepted_per_position
        for pos in range(max(self.num_speculative_tokens, len(accepted))):
            per_pos.add_metric([*self.labels, str(pos)], accepted[pos] if pos < len(accepted) else 0)
        yield per_pos

    def _ssd(self, c: SpecStats) -> Iterator[Metric]:
        yield self._counter("ssd:spec_decode_cache_hits",
                            "SSD speculations verified that the draft answered from its speculation cache",
                            c.num_cache_hits)
        yield self._counter("ssd:spec_decode_cache_misses",
                            "SSD speculations verified that the draft answered with a backup", c.num_cache_misses)
        yield self._counter("ssd:spec_decode_predicted_hit_probability",
                            "Sum of the draft's predicted cache-hit probabilities over the SSD lookups verified "
                            "(divide by ssd:spec_decode_num_predictions for the predicted hit rate)",
                            c.predicted_hit_sum)
        yield self._counter("ssd:spec_decode_num_predictions", "SSD lookups verified that carried a predicted hit "
                            "probability", c.num_predicted)
        yield self._counter("ssd:spec_decode_num_predicted_actual_hits",
                            "Cache hits among the SSD lookups that carried a prediction", c.num_predicted_hits)
        yield self._counter("ssd:spec_decode_rounds", "Speculation rounds of the whole batch", c.num_rounds)
        yield self._counter("ssd:spec_decode_propose_seconds", "Time the batch's rounds spent getting proposals "
                            "(the draft's answer, or a local draft's forwards)", c.propose_s)
        yield self._counter("ssd:spec_decode_verify_seconds", "Time the batch's rounds spent in the target's "
                            "verify forward", c.verify_s)

    def _adaptive(self, s: LoadSnapshot) -> Iterator[Metric]:
        rounds = CounterMetricFamily("ssd:adaptive_rounds", "Decode steps of adaptive requests, by what the "
                                     "engine's mode chooser took (speculate, sd or plain)",
                                     labels=[*METRICS_LABELS, "choice"])
        for choice in CHOICES:
            rounds.add_metric([*self.labels, choice], s.adaptive_rounds.get(choice, 0))
        yield rounds
        yield self._counter("ssd:adaptive_switches", "Times the mode chooser changed its choice between steps",
                            s.adaptive_switches)
        yield self._counter("ssd:adaptive_draft_waits", "Of the adaptive plain steps, those taken while a draft was "
                            "still prefilling new prompts (a speculative round would have waited for it)",
                            s.adaptive_draft_waits)


def build_registry(engine_loop: EngineLoop, model_name: str, num_speculative_tokens: int,
                   is_draft_connected: Callable[[], bool] = lambda: False) -> CollectorRegistry:
    """The target's registry: every series read from `engine_loop.load` at scrape time."""
    registry = CollectorRegistry()
    registry.register(_EngineCollector(engine_loop, model_name, num_speculative_tokens, is_draft_connected))
    return registry
