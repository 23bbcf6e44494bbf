"""bench/cpu_attention_paths.py runs end to end on an AMX CPU: every case timed on both paths, the JSON written."""

import json

import pytest

from bench import cpu_attention_paths
from ssd.layers import cpu_kernels
from ssd_kernels.cpu import extension as own_ext


def test_the_bench_times_each_case_on_both_paths(tmp_path):
    ext = cpu_kernels.extension()
    if ext is None or own_ext.AMX_BF16 not in own_ext.supported_paths(ext):
        pytest.skip("needs a CPU with AMX-BF16")
    out = tmp_path / "attention.json"
    assert cpu_attention_paths.main(["--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(cpu_attention_paths.CASES)
    assert all(r["loops_ms"] > 0 and r["amx_ms"] > 0 for r in rows)
