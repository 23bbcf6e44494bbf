"""The GPU bench of quantized weights at a real shape (bench/quantized_gpu.py) runs end to end at a tiny shape on
the CPU: the random checkpoint loads, every quantization builds, its linears agree with their reference, and each row
carries its floor."""

import json

from bench.quantized_gpu import main


def test_the_quantized_gpu_bench_runs_at_a_tiny_shape_on_cpu(tmp_path):
    out = tmp_path / "result.json"
    assert main(["--device", "cpu", "--layers", "2", "--hidden", "128", "--intermediate", "256", "--heads", "4",
                 "--kv-heads", "2", "--vocab", "512", "--context", "16", "--steps", "3", "--rounds", "1",
                 "--batch", "1,2", "--kv-cache-mb", "16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {(r["quantization"], r["batch"]): r for r in result["runs"]}
    assert set(rows) == {(q, b) for q in ("none", "int8", "int4") for b in (1, 2)}
    assert rows[("int8", 1)]["weight_bytes"] < rows[("none", 1)]["weight_bytes"]
    assert rows[("int4", 1)]["weight_bytes"] < rows[("int8", 1)]["weight_bytes"]
    for q in ("int8", "int4"):
        row = rows[(q, 1)]
        assert row["max_abs_diff_vs_reference"] <= 0.05 * row["reference_max_abs"]
    assert all(r["ms_per_step"] > 0 and r["floor_ms"] > 0 for r in rows.values())
    assert rows[("none", 2)]["kv_bytes"] == 2 * rows[("none", 1)]["kv_bytes"]
