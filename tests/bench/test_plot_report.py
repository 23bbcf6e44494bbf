"""bench/plot.py and bench/report.py on fabricated results: a PNG is written, the markdown renders."""

import json
from pathlib import Path

from bench.plot import load_runs, plot_results
from bench.report import command_for, render


def _run(mode: str, dataset: str, rate: float, **extra) -> dict:  # noqa: ANN003
    return {"mode": mode, "model": "smollm2-135m-instruct", "dataset": dataset, "output_len": 64, "batch": 1,
            "temperature": 0.0, "dtype": "bfloat16", "threads": 2, "draft": "ngram", "k": 4, "num_prompts": 8,
            "decode_tok_s": rate, "ttft_s": 0.09, "tokens_per_round": 1.4 if mode != "ar" else None,
            "accept_rate": 0.2 if mode != "ar" else None, "outputs_sha256": "ab" * 32, "date": "2026-11-29",
            "prompts_identical_to_first": 1.0, **extra}


RUNS = [_run("ar", "mtbench", 24.0), _run("sd", "mtbench", 36.0), _run("ar", "humaneval", 27.0),
        _run("sd", "humaneval", 40.0), _run("sd", "mtbench", 30.0, sweep={"k": 2}),
        _run("sd", "mtbench", 38.0, sweep={"k": 6})]


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_writes_a_png(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"runs": RUNS}))
    out = plot_results(load_runs(results), tmp_path / "plots" / "out.png")
    assert _is_png(out)


def test_single_run_json_loads(tmp_path: Path) -> None:
    results = tmp_path / "one.json"
    results.write_text(json.dumps(RUNS[0]))
    assert load_runs(results) == [RUNS[0]]


def test_report_renders_markdown_with_table_and_plot(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "sd_sweep.json").write_text(json.dumps({"runs": RUNS}))
    (results / "notes.json").write_text(json.dumps({"unrelated": True}))  # not a bench file: skipped
    output = tmp_path / "docs" / "benchmark_results.md"
    text = render(results, output, machine="test machine")
    assert "Machine (where this report was generated): test machine" in text
    assert "ssd bench --mode ar,sd --all --numseqs 8 --output-len 64" in text
    assert "| sd | mtbench | 1 | 36.0 | 1.50 |" in text
    assert "| sd k=6 | mtbench |" in text
    assert "![sd_sweep](img/sd_sweep.png)" in text
    assert _is_png(output.parent / "img" / "sd_sweep.png")
    assert "notes" not in text


def test_recorded_command_wins() -> None:
    assert command_for([_run("ar", "mtbench", 1.0, command="ssd bench --all")]) == "ssd bench --all"
