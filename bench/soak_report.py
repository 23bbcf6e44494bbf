"""The soak's pass criteria and report, from its samples (no processes, no model: unit-testable).

A sample is one dict: "t_s" (monotonic seconds), per process `<kind><i>_rss_mib`, `<kind><i>_fds`,
`<kind><i>_shm_mapped` (kind: target, draft, gateway), per model service `<name>_kv_used`, and
`node_shm_segments`. The first sample is the idle baseline, the last one idle again after the traffic stopped.
Criteria: every KV series and every per-process /dev/shm series ends at its baseline, and each process's RSS
grew less than RSS_GROWTH_LIMIT from the first sample at or after the warm-up to the end.
"""

from collections import Counter
from dataclasses import dataclass

RSS_GROWTH_LIMIT = 0.10


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool
    detail: str


def warmup_row(rows: list[dict[str, float]], warmup_s: float) -> dict[str, float]:
    """The first sample taken at least `warmup_s` after the first one (the last sample if none is)."""
    t0 = rows[0]["t_s"]
    return next((r for r in rows if r["t_s"] - t0 >= warmup_s), rows[-1])


def criteria(rows: list[dict[str, float]], warmup_s: float) -> list[Criterion]:
    """KV and shm back to baseline, RSS growth after warm-up below the limit; one Criterion per series."""
    first, last, warm = rows[0], rows[-1], warmup_row(rows, warmup_s)
    out = []
    for key in sorted(first):
        if key.endswith("_kv_used") or key.endswith("_shm_mapped"):
            end = last.get(key)
            out.append(Criterion(f"{key} back to baseline", end == first[key], f"{first[key]} -> {end}"))
        elif key.endswith("_rss_mib") and key in warm and key in last and warm[key] > 0:
            growth = last[key] / warm[key] - 1.0
            out.append(Criterion(f"{key} growth after warm-up < {RSS_GROWTH_LIMIT:.0%}", growth < RSS_GROWTH_LIMIT,
                                 f"{warm[key]} -> {last[key]} MiB ({growth:+.1%})"))
    return out


def rss_table(rows: list[dict[str, float]], warmup_s: float) -> list[str]:
    """Markdown rows: per process RSS at start / after warm-up / end / peak (MiB)."""
    first, last, warm = rows[0], rows[-1], warmup_row(rows, warmup_s)
    lines = ["| process | RSS start | after warm-up | end | peak |", "|---|---|---|---|---|"]
    for key in sorted(k for k in first if k.endswith("_rss_mib")):
        peak = max(r.get(key, 0.0) for r in rows)
        lines.append(f"| {key.removesuffix('_rss_mib')} | {first[key]} | {warm.get(key)} | {last.get(key)} | {peak} |")
    return lines


def series_table(rows: list[dict[str, float]]) -> list[str]:
    """Markdown rows: every series' first / last (idle) / peak sample."""
    lines = ["| series | first | last (idle) | peak |", "|---|---|---|---|"]
    for key in sorted({k for r in rows for k in r} - {"t_s"}):
        values = [r[key] for r in rows if key in r]
        lines.append(f"| {key} | {values[0]} | {values[-1]} | {max(values)} |")
    return lines


def request_summary(counts: Counter) -> tuple[int, int, dict[str, int]]:
    """(requests, unexpected answers, count per kind) from `kind[:mode]:ok|client_timeout|unexpected[...]` keys
    (a client timeout is not an unexpected answer: the server was still working on it)."""
    per_kind: Counter = Counter()
    unexpected = 0
    for key, n in counts.items():
        per_kind[key.split(":")[0]] += n
        unexpected += n if ":unexpected" in key else 0
    return sum(counts.values()), unexpected, dict(per_kind)


def report(rows: list[dict[str, float]], counts: Counter, warmup_s: float, header: str) -> tuple[str, bool]:
    """The whole report as markdown and whether every criterion held and no answer was unexpected."""
    total, unexpected, per_kind = request_summary(counts)
    checks = criteria(rows, warmup_s)
    passed = unexpected == 0 and all(c.passed for c in checks)
    timeouts = sum(n for k, n in counts.items() if k.endswith(":client_timeout"))
    lines = [header, f"requests: {total}, unexpected answers: {unexpected}, client timeouts: {timeouts}; "
                     f"per kind: {per_kind}",
             "counts: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())), "", *rss_table(rows, warmup_s),
             "", "| criterion | held | figures |", "|---|---|---|",
             *(f"| {c.name} | {'yes' if c.passed else 'NO'} | {c.detail} |" for c in checks), "",
             *series_table(rows), "", f"PASS: {passed}"]
    return "\n".join(lines) + "\n", passed
