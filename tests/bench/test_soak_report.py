"""The soak's pass criteria and report (bench/soak_report.py) on hand-made samples: no processes, no model."""

from collections import Counter

from bench.soak_report import criteria, report, request_summary, warmup_row


def _rows(draft_rss_end: float = 300.0, kv_end: int = 0, shm_end: int = 2) -> list[dict[str, float]]:
    base = {"target0_rss_mib": 2000.0, "draft0_rss_mib": 250.0, "gateway0_rss_mib": 80.0, "target_kv_used": 0,
            "draft_kv_used": 0, "draft0_shm_mapped": 2, "target0_fds": 18, "node_shm_segments": 3}
    busy = base | {"t_s": 100.0, "target_kv_used": 40, "draft_kv_used": 12, "draft0_rss_mib": 280.0,
                   "target0_rss_mib": 2100.0, "gateway0_rss_mib": 120.0}
    end = base | {"t_s": 1800.0, "draft0_rss_mib": draft_rss_end, "target0_rss_mib": 2150.0,
                  "gateway0_rss_mib": 125.0, "target_kv_used": kv_end, "draft0_shm_mapped": shm_end}
    return [base | {"t_s": 0.0}, busy, end]


def test_warmup_row_is_the_first_sample_past_the_warmup():
    rows = _rows()
    assert warmup_row(rows, 50.0) is rows[1]
    assert warmup_row(rows, 0.0) is rows[0]
    assert warmup_row(rows, 10_000.0) is rows[-1]


def test_a_clean_soak_passes_every_criterion():
    checks = criteria(_rows(), warmup_s=60.0)
    assert {c.name.split()[0] for c in checks} == {"target0_rss_mib", "draft0_rss_mib", "gateway0_rss_mib",
                                                   "target_kv_used", "draft_kv_used", "draft0_shm_mapped"}
    assert all(c.passed for c in checks), checks


def test_rss_growth_after_warmup_of_ten_percent_fails():
    checks = {c.name.split()[0]: c for c in criteria(_rows(draft_rss_end=280.0 * 1.1), warmup_s=60.0)}
    assert not checks["draft0_rss_mib"].passed
    assert checks["target0_rss_mib"].passed  # growth before the warm-up sample does not count


def test_kv_or_shm_left_over_fails():
    checks = {c.name.split()[0]: c for c in criteria(_rows(kv_end=3, shm_end=3), warmup_s=60.0)}
    assert not checks["target_kv_used"].passed
    assert not checks["draft0_shm_mapped"].passed
    assert checks["draft_kv_used"].passed


def test_request_summary_counts_kinds_and_unexpected_answers():
    counts = Counter({"stream:ssd:ok": 5, "bad:ok": 3, "deadline:unexpected:200": 1, "whole:sd:ok": 2,
                      "whole:client_timeout": 1})
    assert request_summary(counts) == (12, 1, {"stream": 5, "bad": 3, "deadline": 1, "whole": 3})


def test_report_passes_only_without_unexpected_answers():
    text, passed = report(_rows(), Counter({"stream:sd:ok": 4, "bad:ok": 1}), 60.0, "soak: test")
    assert passed and "PASS: True" in text and "| draft0 | 250.0 | 280.0 | 300.0 | 300.0 |" in text
    _, passed = report(_rows(), Counter({"stream:sd:ok": 4, "bad:unexpected:500": 1}), 60.0, "soak: test")
    assert not passed
