"""Flags of `ssd bench` and its entry point: run modes over real prompts, print a table, save JSON."""

import argparse
import json
import sys
from pathlib import Path

from bench.datasets import load_prompts
from bench.runner import BenchSettings, by_dataset, run_benchmarks
from ssd.cli_flags import (
    STEP_FIELDS,
    add_config_flags,
    add_speculation_flags,
    options_from_args,
    tree_from_args,
)
from ssd.dtypes import resolve_dtype_name
from ssd.errors import InvalidRequestError

MODES = ("ar", "sd", "ssd", "sd-auto", "ssd-auto", "hf", "hf-compiled", "hf-assisted")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("batch sizes must be >= 1")
    return values


def _modes(text: str) -> list[str]:
    modes = text.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    return modes


SWEEPABLE = {"k": int, "batch": int, "draft_temperature": float, "fan_out_budget": int,  # --sweep NAME=v1,v2,...
             "saguaro_c": float, "backup_hits": lambda v: v.lower() in ("1", "true"), "backup": str,
             "fit_fan_out": lambda v: v.lower() in ("1", "true")}


def _sweep(text: str) -> tuple[str, list]:
    name, sep, values = text.partition("=")
    name = {"dtemp": "draft_temperature", "f": "fan_out_budget"}.get(name.replace("-", "_"), name.replace("-", "_"))
    if not sep or name not in SWEEPABLE:
        raise argparse.ArgumentTypeError(f"expected NAME=v1,v2,... with NAME in {', '.join(SWEEPABLE)}; got {text!r}")
    try:
        return name, [SWEEPABLE[name](v) for v in values.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad values in --sweep {text!r}") from None


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from ssd.model_store import DEFAULT_MODEL

    p.add_argument("--mode", default=["ar"], type=_modes,
                   help="comma list; ar: this engine, sd: speculative, ssd: speculative speculative (the draft in "
                        "its own process), sd-auto / ssd-auto: that mode only in batches where the engine measured "
                        "it faster than plain steps, hf: HF transformers generate (same model, dtype, threads), "
                        "hf-compiled: the same with a static KV cache and torch.compile")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dataset", default="mtbench", choices=["mtbench", "humaneval", "all"])
    p.add_argument("--numseqs", type=int, default=16, help="prompts per dataset")
    p.add_argument("--output-len", type=int, default=128, help="tokens generated per prompt (EOS ignored)")
    p.add_argument("--batch", type=_int_list, default=[1], help="prompts decoded together (comma list)")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    add_config_flags(p, ("dtype", "quantization", "num_threads", "tensor_parallel_size", *STEP_FIELDS),
                     defaults={"num_threads": 2}, whose="the target's")
    p.add_argument("--warmup", type=int, default=1, help="untimed prompts run first, per mode and batch")
    p.add_argument("--target-core", type=int, default=None,
                   help="pin this process (the target in every mode) to one CPU core, e.g. 0 with --threads 1")
    p.add_argument("--draft-core", type=int, default=None, help="ssd: pin the draft process to this CPU core")
    add_speculation_flags(p, ("fan_out_budget", "fan_out", "backup", "saguaro_c", "backup_hits",  # BenchSettings has these
                              "fit_fan_out"))
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--all", action="store_true", help="every packaged data set (= --dataset all)")
    p.add_argument("--sweep", type=_sweep, default=None,
                   help="repeat the speculative modes over values in one process, e.g. k=2,4,6 (batch=1,4,8 "
                        "sweeps every mode)")
    p.add_argument("--interleave", action="store_true",
                   help="the modes of a batch size take turns group by group instead of running one after another, "
                        "so their ratios see the same minutes of the machine (each mode keeps its own engine)")
    p.add_argument("--plot", type=Path, default=None, help="draw tokens/s per mode and data set (PNG)")
    p.add_argument("--against", default=None, metavar="URL",
                   help="benchmark a running OpenAI-compatible server (e.g. our gateway) over HTTP instead")
    p.add_argument("--api-key", default=None, help="--against: bearer key (default: $SSD_API_KEY)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.numseqs < 1 or args.output_len < 1:
        raise InvalidRequestError("--numseqs and --output-len must be >= 1")
    dataset = "all" if args.all else args.dataset
    prompts = load_prompts(dataset, args.numseqs)
    if args.against:
        runs = _run_against(args, prompts)
    else:
        sweep = args.sweep
        batches = sweep[1] if sweep and sweep[0] == "batch" else args.batch
        base = BenchSettings(
            mode=args.mode[0], model=args.model, dataset=dataset, output_len=args.output_len,
            batch=batches[0], temperature=args.temp, dtype=resolve_dtype_name(args.dtype), threads=args.num_threads,
            warmup=args.warmup,
            draft=args.draft, k=args.k, draft_temperature=args.dtemp,
            tree=tree_from_args(args), fan_out_budget=args.fan_out_budget, fan_out=args.fan_out,
            backup=args.backup, saguaro_c=args.saguaro_c, backup_hits=args.backup_hits, draft_core=args.draft_core,
            fit_fan_out=args.fit_fan_out,
            tensor_parallel_size=args.tensor_parallel_size, quantization=args.quantization,
            **options_from_args(args, STEP_FIELDS),
        )
        if args.target_core is not None:
            import os

            os.sched_setaffinity(0, {args.target_core})
        runs = run_benchmarks(base, args.mode, batches, prompts, None if sweep and sweep[0] == "batch" else sweep,
                              interleave=args.interleave)
    command = "ssd " + " ".join(sys.argv[sys.argv.index("bench"):]) if "bench" in sys.argv else None
    for r in runs:
        r["command"] = command
    doc = runs[0] if len(runs) == 1 else {"runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(runs, sys.stdout)
    if args.plot:
        from bench.plot import plot_results

        plot_results(runs, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _run_against(args: argparse.Namespace, prompts: list) -> list[dict]:
    import os

    from bench.against import AgainstSettings, render_texts, run_against

    modes = [m for m in args.mode if m in ("ar", "sd", "ssd")] or [None]
    runs = []
    for name, group in by_dataset(prompts).items():
        texts = render_texts(args.model, group)
        for mode in modes:
            s = AgainstSettings(url=args.against, model=None, api_key=args.api_key or os.environ.get("SSD_API_KEY", "none"),
                                output_len=args.output_len, temperature=args.temp, mode=mode)
            runs.append({**run_against(s, texts, warmup=args.warmup), "dataset": name})
    return runs


def print_table(runs: list[dict], out) -> None:  # type: ignore[no-untyped-def]
    """One row per run; `vs first` divides by the first run of the same data set."""
    firsts: dict[str, float] = {}
    print(f"{'mode':16} {'dataset':10} {'batch':>5} {'decode tok/s':>13} {'vs first':>9} {'TTFT ms':>8} "
          f"{'tok/round':>9} {'hit rate':>8} {'outputs hash':>16}", file=out)
    for r in runs:
        tpr = f"{r['tokens_per_round']:9.2f}" if r.get("tokens_per_round") else f"{'-':>9}"
        mode = r["mode"] + "".join(f" {k}={v}" for k, v in (r.get("sweep") or {}).items())
        first = firsts.setdefault(r["dataset"], r["decode_tok_s"] or 1.0)
        digest = r.get("outputs_sha256") or "text:" + r["outputs_text_sha256"]
        hits = f"{r['cache_hit_rate']:8.2f}" if r.get("cache_hit_rate") is not None else f"{'-':>8}"
        print(f"{mode:16} {r['dataset']:10} {r['batch']:5d} {r['decode_tok_s']:13.1f} "
              f"{r['decode_tok_s'] / first:8.2f}x {1000 * r['ttft_s']:8.0f} {tpr} {hits} {digest[:16]:>16}", file=out)
