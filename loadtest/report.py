"""The ghz report: the same JSON keys and units (durations in nanoseconds, histogram marks in seconds),
plus a `streaming` section (TTFT and inter-token latency; for client / bidi streams the messages sent and
received, and in lockstep each message's round trip to its reply) that ghz readers ignore, and ghz's text
summary.

Latency statistics cover successful calls only (ghz's default, without --count-errors); `count`
and `rps` cover every call.
"""

import statistics
import time
from collections import Counter
from pathlib import Path

import grpc

from loadtest.options import LoadOptions
from loadtest.runner import RunResult, status_name

PERCENTAGES = (10, 25, 50, 75, 90, 95, 99)
NUM_BUCKETS = 10


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _percentile(sorted_values: list[float], percentage: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = max(int(round(percentage / 100 * len(sorted_values))) - 1, 0)
    return sorted_values[min(index, len(sorted_values) - 1)]


def _distribution(values: list[float]) -> list[dict]:
    ordered = sorted(values)
    return [{"percentage": p, "latency": _ns(_percentile(ordered, p))} for p in PERCENTAGES] if ordered else []


def _histogram(values: list[float]) -> list[dict]:
    if not values:
        return []
    low, high = min(values), max(values)
    width = (high - low) / NUM_BUCKETS or 1e-9
    counts = Counter(min(int((v - low) / width), NUM_BUCKETS - 1) for v in values)
    return [{"mark": low + width * (i + 1), "count": counts[i], "frequency": counts[i] / len(values)}
            for i in range(NUM_BUCKETS)]


def _summary_stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "average": 0, "fastest": 0, "slowest": 0, "latencyDistribution": []}
    return {"count": len(values), "average": _ns(statistics.fmean(values)), "fastest": _ns(min(values)),
            "slowest": _ns(max(values)), "latencyDistribution": _distribution(values)}


def _options(opts: LoadOptions) -> dict:
    options = {"call": opts.call, "host": opts.host, "insecure": opts.is_insecure, "concurrency": opts.concurrency,
               "total": opts.total, "duration": _ns(opts.duration_s or 0), "rps": opts.rps or 0,
               "connections": opts.connections, "timeout": _ns(opts.timeout_s), "data": opts.data}
    extra = {"data-file": opts.data_file, "proto": opts.proto, "protoset": opts.protoset,
             "import-paths": list(map(str, opts.import_paths)) or None,
             "stream-interval": _ns(opts.stream_interval_s) or None,
             "stream-call-count": opts.stream_call_count or None,
             "stream-call-duration": _ns(opts.stream_call_duration_s) if opts.stream_call_duration_s else None,
             "stream-dynamic-messages": opts.is_stream_dynamic or None, "lockstep-field": opts.lockstep_field}
    return options | {key: str(value) if isinstance(value, Path) else value
                      for key, value in extra.items() if value is not None}


def build_report(run: RunResult, opts: LoadOptions) -> dict:
    ok = [r.latency_s for r in run.results if r.status == grpc.StatusCode.OK]
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "endReason": run.end_reason,
        "options": _options(opts),
        "count": len(run.results),
        "total": _ns(run.total_s),
        "average": _ns(statistics.fmean(ok)) if ok else 0,
        "fastest": _ns(min(ok)) if ok else 0,
        "slowest": _ns(max(ok)) if ok else 0,
        "rps": len(run.results) / run.total_s if run.total_s > 0 else 0.0,
        "errorDistribution": dict(Counter(r.error for r in run.results if r.error)),
        "statusCodeDistribution": dict(Counter(status_name(r.status) for r in run.results)),
        "latencyDistribution": _distribution(ok),
        "histogram": _histogram(ok),
        "details": [{"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(r.start_s)) + "Z",
                     "latency": _ns(r.latency_s), "error": r.error, "status": status_name(r.status)}
                    for r in run.results],
    }
    if run.is_streaming:
        ttft = [r.ttft_s for r in run.results if r.ttft_s is not None]
        gaps = [g for r in run.results for g in r.token_gaps_s]
        report["streaming"] = {"ttft": _summary_stats(ttft), "interTokenLatency": _summary_stats(gaps)}
    if run.kind in ("client_streaming", "bidi"):
        ok_calls = [r for r in run.results if r.status == grpc.StatusCode.OK]
        trips = [t for r in ok_calls for t in r.round_trips_s]
        report.setdefault("streaming", {}).update({
            "messagesSent": sum(r.num_sent for r in run.results),
            "messagesReceived": sum(r.num_received for r in run.results),
            "roundTrip": _summary_stats(trips)})
    return report


def _fmt(ns: int) -> str:
    return f"{ns / 1e6:.2f} ms" if ns < 1e9 else f"{ns / 1e9:.2f} s"


def format_summary(report: dict) -> str:
    """ghz's `-O summary` text."""
    lines = ["", "Summary:", f"  Count:\t{report['count']}", f"  Total:\t{_fmt(report['total'])}",
             f"  Slowest:\t{_fmt(report['slowest'])}", f"  Fastest:\t{_fmt(report['fastest'])}",
             f"  Average:\t{_fmt(report['average'])}", f"  Requests/sec:\t{report['rps']:.2f}", ""]
    if report["histogram"]:
        most = max(b["count"] for b in report["histogram"]) or 1
        lines.append("Response time histogram:")
        lines += [f"  {1000 * b['mark']:.3f} [{b['count']}]\t|{'∎' * round(40 * b['count'] / most)}"
                  for b in report["histogram"]]
        lines.append("")
    if report["latencyDistribution"]:
        lines.append("Latency distribution:")
        lines += [f"  {d['percentage']} % in {_fmt(d['latency'])} " for d in report["latencyDistribution"]]
        lines.append("")
    for name, stats in report.get("streaming", {}).items():
        if isinstance(stats, dict) and stats["count"]:
            dist = ", ".join(f"p{d['percentage']} {_fmt(d['latency'])}" for d in stats["latencyDistribution"])
            lines.append(f"Streaming {name}: average {_fmt(stats['average'])} ({dist})")
    if "messagesSent" in report.get("streaming", {}):
        stream = report["streaming"]
        lines.append(f"Stream messages: {stream['messagesSent']} sent, {stream['messagesReceived']} received")
    lines.append("Status code distribution:")
    lines += [f"  [{code}]\t{n} responses" for code, n in report["statusCodeDistribution"].items()]
    if report["errorDistribution"]:
        lines += ["", "Error distribution:"]
        lines += [f"  [{n}]\t{error}" for error, n in report["errorDistribution"].items()]
    return "\n".join(lines) + "\n"
