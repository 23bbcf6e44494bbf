"""Flags of `ssd loadtest` (ghz's names and defaults) and its entry point: run, then print or write the report."""

import argparse
import asyncio
import json
import sys
from pathlib import Path

from loadtest.errors import LoadTestError
from loadtest.options import LoadOptions


def _duration(text: str) -> float:
    """ghz durations: '30s', '500ms', '2m', '1h', or plain seconds."""
    for suffix, scale in (("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            text, factor = text[: -len(suffix)], scale
            break
    else:
        factor = 1.0
    try:
        return float(text) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 30s or 500ms, got {text!r}") from None


def add_loadtest_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="server address, host:port")
    p.add_argument("--call", required=True, help="package.Service.Method, e.g. ssd.v1.Verifier.GetInfo")
    p.add_argument("-d", "--data", default="{}", help="request message as JSON")
    p.add_argument("-m", "--metadata", default="{}", help='call metadata as a JSON object, e.g. {"authorization": '
                                                           '"Bearer KEY"}')
    p.add_argument("-c", "--concurrency", type=int, default=50, help="concurrent workers")
    p.add_argument("-n", "--total", type=int, default=200, help="requests to run (ignored with -z)")
    p.add_argument("-z", "--duration", type=_duration, default=None, help="run for this long (e.g. 30s)")
    p.add_argument("--rps", type=float, default=None, help="overall requests per second (default: no limit)")
    p.add_argument("--connections", type=int, default=1, help="gRPC channels the workers share")
    p.add_argument("-t", "--timeout", type=_duration, default=20.0, help="per-call deadline (default 20s)")
    p.add_argument("--insecure", action="store_true", help="plaintext (no TLS), as for our local services")
    p.add_argument("-O", "--format", default="summary", choices=["summary", "json", "pretty"],
                   help="summary: ghz's text; json / pretty: ghz's JSON report")
    p.add_argument("-o", "--output", type=Path, default=None, help="write the report here instead of stdout")
    p.set_defaults(func=main)


def options_from_args(args: argparse.Namespace) -> LoadOptions:
    try:
        metadata = json.loads(args.metadata)
    except json.JSONDecodeError as e:
        raise LoadTestError(f"-m is not a JSON object: {e}") from None
    if not isinstance(metadata, dict):
        raise LoadTestError("-m must be a JSON object of string values")
    if args.concurrency < 1 or args.total < 1 or args.connections < 1:
        raise LoadTestError("-c, -n and --connections must be >= 1")
    if args.rps is not None and args.rps <= 0:
        raise LoadTestError("--rps must be > 0")
    return LoadOptions(host=args.host, call=args.call, data=args.data,
                       metadata=tuple((k.lower(), str(v)) for k, v in metadata.items()),
                       concurrency=args.concurrency, total=args.total, duration_s=args.duration, rps=args.rps,
                       connections=args.connections, timeout_s=args.timeout, is_insecure=args.insecure)


def main(args: argparse.Namespace) -> int:
    from loadtest.report import build_report, format_summary
    from loadtest.runner import run_load

    try:
        opts = options_from_args(args)
        run = asyncio.run(run_load(opts))
    except LoadTestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = build_report(run, opts)
    if args.format == "summary":
        text = format_summary(report)
    else:
        text = json.dumps(report, indent=2 if args.format == "pretty" else None) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
