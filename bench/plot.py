"""Draw bench results: decode tokens/s per mode, grouped by data set, with speedup labels; for a sweep,
tokens/s against the swept value. Reads the result dicts `ssd bench` writes (runs of bench/runner.py)."""

from pathlib import Path

MODE_COLORS = {"ar": "#7f7f7f", "sd": "#1f77b4", "ssd": "#d62728", "hf": "#bcbd22", "hf-compiled": "#8c564b", "hf-assisted": "#17becf"}


def _label(run: dict) -> str:
    sweep = "".join(f" {k}={v}" for k, v in (run.get("sweep") or {}).items())
    batch = f" b{run['batch']}" if run.get("batch", 1) != 1 else ""
    return f"{run['mode']}{sweep}{batch}"


def _bars(ax, runs: list[dict]) -> None:  # noqa: ANN001
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    labels = list(dict.fromkeys(_label(r) for r in runs))
    width = 0.8 / len(labels)
    swept = [label for label in labels if "=" in label]  # each swept setting gets its own shade
    for j, label in enumerate(labels):
        for i, dataset in enumerate(datasets):
            run = next((r for r in runs if r["dataset"] == dataset and _label(r) == label), None)
            if run is None:
                continue
            base = next((r for r in runs if r["dataset"] == dataset and r["mode"] == "ar"), None)
            x = i - 0.4 + width * (j + 0.5)
            rate = run["decode_tok_s"]
            color = MODE_COLORS.get(run["mode"], f"C{j}")
            if label in swept:
                from matplotlib import colormaps

                color = colormaps["Blues"](0.45 + 0.5 * swept.index(label) / max(len(swept) - 1, 1))
            ax.bar(x, rate, width * 0.92, color=color,
                   label=label if i == datasets.index(run["dataset"]) else None)
            speedup = f"\n{rate / base['decode_tok_s']:.2f}x" if base and base["decode_tok_s"] else ""
            ax.text(x, rate, f"{rate:.1f}{speedup}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("decode tokens/s (prefill excluded)")
    ax.set_title("decode throughput per mode (speedup vs ar)")
    ax.margins(y=0.2)
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=8)


def _sweep_lines(ax, runs: list[dict]) -> None:  # noqa: ANN001
    swept = [r for r in runs if r.get("sweep")]
    name = next(iter(swept[0]["sweep"]))
    for dataset in dict.fromkeys(r["dataset"] for r in swept):
        points = sorted((r["sweep"][name], r["decode_tok_s"]) for r in swept if r["dataset"] == dataset)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{swept[0]['mode']} {dataset}")
        base = next((r for r in runs if r["dataset"] == dataset and r["mode"] == "ar"), None)
        if base:
            ax.axhline(base["decode_tok_s"], linestyle="--", linewidth=1, color="gray")
            ax.text(points[0][0], base["decode_tok_s"], f" ar {dataset}", va="bottom", fontsize=8, color="gray")
    ax.set_xlabel(name)
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"tokens/s vs {name}")
    ax.legend(fontsize=8)


def plot_results(runs: list[dict], path: Path) -> Path:
    """Write a PNG: the per-mode bar chart, plus a tokens/s-vs-value panel when the runs hold a sweep."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    has_sweep = any(r.get("sweep") for r in runs)
    fig, axes = plt.subplots(1, 2 if has_sweep else 1, figsize=(13 if has_sweep else 8, 5), squeeze=False)
    _bars(axes[0][0], runs)
    if has_sweep:
        _sweep_lines(axes[0][1], runs)
    first = runs[0]
    fig.suptitle(f"{first.get('model', first.get('served_model', ''))}, {first.get('dtype', '')}, "
                 f"{first.get('output_len', '')} tokens per prompt, {first.get('date', '')}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_runs(path: Path) -> list[dict]:
    """The runs of a results JSON (one run or {"runs": [...]})."""
    import json

    doc = json.loads(path.read_text())
    return doc["runs"] if "runs" in doc else [doc]
