"""Flags of `ssd bench` and its entry point: run modes over real prompts, print a table, save JSON."""

import argparse
import json
import sys
from pathlib import Path

from bench.datasets import load_prompts
from bench.runner import BenchSettings, run_benchmarks
from ssd.cli_flags import add_speculation_flags, tree_from_args
from ssd.errors import InvalidRequestError

MODES = ("ar", "sd", "hf", "hf-assisted")


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


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from ssd.model_store import DEFAULT_MODEL

    p.add_argument("--mode", default=["ar"], type=_modes,
                   help="comma list; ar: this engine, hf: HF transformers generate (same model, dtype, threads)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dataset", default="mtbench", choices=["mtbench", "humaneval", "all"])
    p.add_argument("--numseqs", type=int, default=16, help="prompts per dataset")
    p.add_argument("--output-len", type=int, default=128, help="tokens generated per prompt (EOS ignored)")
    p.add_argument("--batch", type=_int_list, default=[1], help="prompts decoded together (comma list)")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed prompts run first, per mode and batch")
    add_speculation_flags(p)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.numseqs < 1 or args.output_len < 1:
        raise InvalidRequestError("--numseqs and --output-len must be >= 1")
    base = BenchSettings(
        mode=args.mode[0], model=args.model, dataset=args.dataset, output_len=args.output_len,
        batch=args.batch[0], temperature=args.temp, dtype=args.dtype, threads=args.threads, warmup=args.warmup,
        draft=args.draft, k=args.k, draft_temperature=args.dtemp,
        tree=tree_from_args(args),
    )
    prompts = load_prompts(args.dataset, args.numseqs)
    runs = run_benchmarks(base, args.mode, args.batch, prompts)
    doc = runs[0] if len(runs) == 1 else {"runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print_table(runs, sys.stdout)
    return 0


def print_table(runs: list[dict], out) -> None:  # type: ignore[no-untyped-def]
    first = runs[0]["decode_tok_s"] or 1.0
    print(f"{'mode':12} {'batch':>5} {'decode tok/s':>13} {'vs first':>9} {'TTFT ms':>8} {'tok/round':>9} "
          f"{'outputs_sha256':>16}", file=out)
    for r in runs:
        tpr = f"{r['tokens_per_round']:9.2f}" if r.get("tokens_per_round") else f"{'-':>9}"
        print(f"{r['mode']:12} {r['batch']:5d} {r['decode_tok_s']:13.1f} {r['decode_tok_s'] / first:8.2f}x "
              f"{1000 * r['ttft_s']:8.0f} {tpr} {r['outputs_sha256'][:16]:>16}", file=out)
