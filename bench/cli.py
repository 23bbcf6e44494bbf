"""Flags of `ssd bench` and its entry point: run one mode over real prompts, print and save JSON."""

import argparse
import json
import sys
from pathlib import Path

from bench.datasets import load_prompts
from bench.runner import BenchSettings, run_benchmark

MODES = ("ar", "hf")


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from ssd.model_store import DEFAULT_MODEL

    p.add_argument("--mode", default="ar", choices=MODES, help="ar: this engine; hf: HF transformers generate")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dataset", default="mtbench", choices=["mtbench", "humaneval", "all"])
    p.add_argument("--numseqs", type=int, default=16, help="prompts per dataset")
    p.add_argument("--output-len", type=int, default=128, help="tokens generated per prompt (EOS ignored)")
    p.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed prompts run first")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    settings = BenchSettings(
        mode=args.mode, model=args.model, dataset=args.dataset, output_len=args.output_len,
        batch=args.batch, temperature=args.temp, dtype=args.dtype, threads=args.threads, warmup=args.warmup,
    )
    prompts = load_prompts(args.dataset, args.numseqs)
    result = run_benchmark(settings, prompts)
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    print(
        f"{result['mode']}: {result['decode_tok_s']:.1f} decode tok/s, TTFT {1000 * result['ttft_s']:.0f} ms, "
        f"{result['num_prompts']} prompts x {args.output_len} tokens, batch {args.batch}, {args.dtype}, "
        f"{args.threads} threads",
        file=sys.stderr,
    )
    return 0
