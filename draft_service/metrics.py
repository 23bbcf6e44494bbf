"""The draft's Prometheus metrics: vLLM's names where the draft is an engine like vLLM's, SSD's own under `ssd:`.

Under `model_name` = the draft (so they never add up with the target's series): the sequences it holds
(`vllm:num_requests_running`), its KV use and the draft tokens it generated (`vllm:generation_tokens`).
Acceptance is the target's to count (target_service/metrics.py). The SSD side: speculation-cache answers,
backups, and the time cache builds take, to set against the target's verify time. The EAGLE-3 head's own
prefix cache: head positions asked of it and restored from it (`ssd:draft_prefix_cache_*`). The catch-ups of mode
auto's plain steps (`ssd:draft_catch_up*`). Read at scrape time.
"""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from draft_service.servicer import SpeculatorServicer
from rpc.metrics_http import ENGINE_INDEX, METRICS_LABELS
from ssd.speculation.head_prefix_cache import HeadPrefixCounters
from ssd.speculation.ssd_speculator import SsdCounters


class _DraftCollector:
    def __init__(self, servicer: SpeculatorServicer) -> None:
        self.servicer = servicer
        self.labels = [servicer.draft_name, ENGINE_INDEX]

    def _family(self, kind: type, name: str, doc: str, value: float) -> Metric:
        family = kind(name, doc, labels=METRICS_LABELS)
        family.add_metric(self.labels, value)
        return family

    def collect(self) -> Iterator[Metric]:
        sv = self.servicer
        sessions = list(sv.sessions.values())
        used, total = _kv_blocks(sv)
        yield self._family(GaugeMetricFamily, "vllm:num_requests_running",
                           "Sequences the draft holds, over all sessions", sum(len(s.seqs) for s in sessions))
        yield self._family(GaugeMetricFamily, "vllm:kv_cache_usage_perc",
                           "The draft's KV-cache usage. 1 means 100 percent usage.", used / total if total else 0.0)
        yield self._family(CounterMetricFamily, "vllm:generation_tokens", "Draft tokens the draft proposed.",
                           sv.counters.num_draft_tokens)
        yield self._family(GaugeMetricFamily, "ssd:draft_sessions", "Open sessions (one per target)", len(sessions))
        yield self._family(CounterMetricFamily, "ssd:draft_speculations",
                           "Speculations answered (one per sequence per round)", sv.counters.num_drafts)
        yield self._family(CounterMetricFamily, "ssd:draft_catch_ups",
                           "catch_up messages taken: targets' plain steps (mode auto) the draft caught up on",
                           sv.num_catch_ups)
        yield self._family(CounterMetricFamily, "ssd:draft_catch_up_tokens",
                           "Committed tokens the catch_up messages brought (run beside the targets' plain steps)",
                           sv.num_catch_up_tokens)
        yield from self._ssd(sv.ssd.counters if sv.ssd is not None else SsdCounters())
        prefix = getattr(sv.proposer, "prefix_cache", None)
        yield from self._prefix(prefix.counters if prefix is not None else HeadPrefixCounters())

    def _prefix(self, c: HeadPrefixCounters) -> Iterator[Metric]:
        yield self._family(CounterMetricFamily, "ssd:draft_prefix_cache_queries",
                           "Head positions (tokens) of new sequences asked of the draft's prefix cache",
                           c.num_query_positions)
        yield self._family(CounterMetricFamily, "ssd:draft_prefix_cache_hits",
                           "Head positions (tokens) restored from the draft's prefix cache", c.num_hit_positions)

    def _ssd(self, c: SsdCounters) -> Iterator[Metric]:
        counter = CounterMetricFamily
        yield self._family(counter, "ssd:speculation_cache_hits", "SSD lookups answered from the speculation cache",
                           c.num_hits)
        yield self._family(counter, "ssd:speculation_cache_misses", "SSD lookups answered with a backup",
                           c.num_misses)
        backups = CounterMetricFamily("ssd:speculation_backups", "Backups drafted on a cache miss, by kind",
                                      labels=[*METRICS_LABELS, "kind"])
        backups.add_metric([*self.labels, "neural"], c.num_neural_backups)
        backups.add_metric([*self.labels, "fast"], c.num_fast_backups)
        yield backups
        yield self._family(counter, "ssd:speculation_cache_builds", "Speculation-cache builds (one per round)",
                           c.num_builds)
        yield self._family(counter, "ssd:speculation_cache_build_seconds",
                           "Time spent building speculation caches (overlaps the target's verify)", c.build_s)
        yield self._family(counter, "ssd:speculation_cache_lookup_seconds", "Time spent in cache lookups",
                           c.lookup_s)
        yield self._family(counter, "ssd:speculation_backup_seconds", "Time spent drafting backups", c.backup_s)
        yield self._family(counter, "ssd:speculation_predicted_hit_probability",
                           "Sum of the predicted hit probabilities of the lookups (divide by "
                           "ssd:speculation_num_predictions for the predicted hit rate)", c.predicted_hits)
        yield self._family(counter, "ssd:speculation_num_predictions", "Lookups that had a predicted hit probability",
                           c.num_predicted)


def _kv_blocks(servicer: SpeculatorServicer) -> tuple[int, int]:
    """(used, total) KV blocks of the draft's model; (0, 0) for n-gram."""
    worker = getattr(servicer.proposer, "worker", None)
    if worker is None:
        return 0, 0
    total = worker.block_manager.num_blocks
    return total - worker.block_manager.num_free_blocks, total


def build_registry(servicer: SpeculatorServicer) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_DraftCollector(servicer))
    return registry
