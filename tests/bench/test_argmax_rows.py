"""bench/argmax_rows.py runs end to end: every shape timed both ways, the same indices, the JSON written."""

import json

from bench import argmax_rows


def test_the_bench_times_each_shape_both_ways(tmp_path):
    out = tmp_path / "argmax.json"
    assert argmax_rows.main(["--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rows"], r["vocab"]) for r in rows] == list(argmax_rows.SHAPES)
    assert all(r["torch_ms"] > 0 and r["own_ms"] > 0 for r in rows)
