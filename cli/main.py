"""The `ssd` command: generate, models (pull / list), bench. Parses flags, builds configs, runs.

Commands that load a known model pull it first when it is not cached, unless --offline (SSD_OFFLINE=1).
"""

import argparse
import os
import sys
import time

from ssd.cli_flags import (
    add_config_flags,
    add_speculation_flags,
    options_from_args,
    speculation_from_args,
)
from ssd.config import DecodeMode
from ssd.errors import SSDError
from ssd.log_setup import configure_logging

# the engine settings `ssd generate` takes (flags generated from ssd/cli_flags.py CONFIG_FLAGS)
_ENGINE_FIELDS = ("dtype", "quantization", "num_threads", "device", "tensor_parallel_size", "compile",
                  "enforce_eager", "attention_backend")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    from ssd.model_store import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint folder or known model name")
    add_config_flags(p, _ENGINE_FIELDS, overrides={"dtype": {"choices": ["auto", "float32", "bfloat16", "float16"]},
                                                   "num_threads": {"help": "torch threads (default: torch's choice)"}})
    _add_offline_flag(p)


def _add_offline_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true",
                   help="never download: a model that is not cached is an error (also SSD_OFFLINE=1)")


def _pull_on_demand(args: argparse.Namespace) -> None:
    """--offline turns offline mode on for this process and its children; known models named by --model /
    --draft that are not cached are pulled now (a progress bar on a terminal), unless offline."""
    from ssd.fetch import OFFLINE_ENV
    from ssd.model_store import KNOWN_MODELS, ensure_model

    if getattr(args, "offline", False):
        os.environ[OFFLINE_ENV] = "1"
    if getattr(args, "pulls_models", False):
        for name in (getattr(args, "model", None), getattr(args, "draft", None)):
            if name in KNOWN_MODELS:
                ensure_model(name)


def _cmd_generate(args: argparse.Namespace) -> int:
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    speculation = speculation_from_args(args, args.mode)
    # one prompt: an engine of one sequence a step (the quantized CPU kernels pick their fastest path for one row)
    llm = LLM(args.model, speculation=speculation, max_num_seqs=1, **options_from_args(args, _ENGINE_FIELDS))
    prompt = llm.chat_prompt([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, seed=args.seed, draft_temperature=args.dtemp, grammar=_grammar(args),
    )
    start = time.perf_counter()
    first = None
    tokens = 0
    for delta in llm.generate_stream(prompt, params):
        first = first or time.perf_counter()
        tokens += len(delta.token_ids)
        sys.stdout.write(delta.text)
        sys.stdout.flush()
    end = time.perf_counter()
    decode_s = end - (first or end)
    rate = (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0
    stats = llm.engine.speculative_decoder.counters if llm.engine.speculative_decoder is not None else None
    extra = f", {stats.tokens_per_round:.2f} tokens/round" if stats and stats.num_drafts else ""
    print(f"\n\n[{tokens} tokens, first token {1000 * ((first or end) - start):.0f} ms, "
          f"decode {rate:.1f} tokens/s, {args.mode}, {args.dtype}{extra}]", file=sys.stderr)
    return 0


def _grammar(args: argparse.Namespace):  # noqa: ANN202 (ssd.sampling.grammar.Grammar | None)
    """--json-schema (a file, or the schema's text), --regex or --grammar (a Lark file or text), as the request's
    grammar."""
    from pathlib import Path

    from ssd.sampling.grammar import Grammar

    if args.json_schema is not None:
        source = args.json_schema
        if not source.lstrip().startswith("{") and Path(source).is_file():
            source = Path(source).read_text()
        return Grammar("json_schema", source)
    if args.grammar is not None:
        source = args.grammar
        return Grammar("lark", Path(source).read_text() if "\n" not in source and Path(source).is_file() else source)
    return Grammar("regex", args.regex) if args.regex is not None else None


def _cmd_models(args: argparse.Namespace) -> int:
    from ssd import model_store

    if args.models_cmd == "pull":
        path = model_store.pull(args.name, force=args.force)
        print(path)
        return 0
    rows = model_store.list_models()
    print(f"{'NAME':28} {'CACHED':7} {'SIZE':>9}  PATH")
    for m in rows:
        size = f"{m.size_bytes / 2**20:.0f} MiB" if m.is_cached else "-"
        print(f"{m.name:28} {'yes' if m.is_cached else 'no':7} {size:>9}  {m.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ssd", description="ssd-serve: fast, lossless LLM decoding")
    parser.add_argument("--log-level", default="info", help="debug | info | warning | error")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines (production)")
    sub = parser.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt, streaming to stdout")
    _add_engine_flags(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE_OR_JSON",
                       help="structured output: the answer is JSON following this schema ('{\"type\": \"object\"}': "
                            "any object)")
    shape.add_argument("--regex", help="structured output: the whole answer matches this regular expression")
    shape.add_argument("--grammar", metavar="FILE_OR_LARK",
                       help="structured output: the answer follows this Lark grammar (llguidance's dialect, rule "
                            "`start`)")
    g.add_argument("--mode", default=DecodeMode.AR, type=DecodeMode, choices=list(DecodeMode),
                   help="ar: plain decoding; sd: speculative; ssd: speculative speculative (in one process here: "
                        "answer + cache build in turn, for checking; `ssd serve` / `ssd bench` overlap them)")
    add_speculation_flags(g)
    g.set_defaults(func=_cmd_generate, pulls_models=True)

    m = sub.add_parser("models", help="manage the local model cache")
    msub = m.add_subparsers(dest="models_cmd", required=True)
    pull = msub.add_parser("pull", help="fetch and import a known model into the cache")
    pull.add_argument("name")
    pull.add_argument("--force", action="store_true", help="re-import even if cached")
    msub.add_parser("list", help="show known and cached models")
    m.set_defaults(func=_cmd_models)

    b = sub.add_parser("bench", help="benchmark decoding modes on real prompts")
    from bench.cli import add_bench_arguments  # noqa: PLC0415 - bench is only needed for this command

    add_bench_arguments(b)
    _add_offline_flag(b)
    b.set_defaults(pulls_models=True)
    from draft_training.cli import add_draft_training_commands  # noqa: PLC0415 - lazy: heavy deps

    add_draft_training_commands(sub)
    from deploy.cli import add_serve_command  # noqa: PLC0415 - lazy: the services' deps

    add_serve_command(sub)
    from deploy.chat import add_chat_arguments  # noqa: PLC0415 - lazy: the openai client

    add_chat_arguments(sub.add_parser("chat", help="interactive streaming chat with a gateway (or a local stack)"))
    from loadtest.cli import add_loadtest_arguments  # noqa: PLC0415 - lazy: grpc

    add_loadtest_arguments(sub.add_parser("loadtest", help="ghz-style gRPC load test of a service"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, json=args.log_json)
    try:
        _pull_on_demand(args)
        return args.func(args)
    except SSDError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
