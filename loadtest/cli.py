"""Flags of `ssd loadtest` (ghz's names and defaults) and its entry point: run, then print or write the report.

`--record-to FILE --listen ADDRESS` turns it into a recording proxy instead (loadtest/record.py): streams of
--call sent to ADDRESS go on to the host, and their request messages are written to FILE for `-D`.
"""

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
    p.add_argument("-d", "--data", default="{}",
                   help="request message as JSON (ghz templates such as {{.RequestNumber}} allowed); a JSON array: "
                        "a client- or bidi-stream's messages, else items used round-robin")
    p.add_argument("-D", "--data-file", type=Path, default=None,
                   help="the call data in a file; a .jsonl file holds one item per line (call i uses line i mod n), "
                        "e.g. recorded Speculator.Session streams")
    p.add_argument("--proto", type=Path, default=None, help="resolve --call from this .proto file (compiled here)")
    p.add_argument("-i", "--import-paths", default="",
                   help="comma-separated import paths of --proto (the working directory and the file's folder are "
                        "added)")
    p.add_argument("--protoset", type=Path, default=None,
                   help="resolve --call from this compiled FileDescriptorSet (protoc --include_imports "
                        "--descriptor_set_out)")
    p.add_argument("--stream-interval", type=_duration, default=0.0, help="wait between a stream's messages")
    p.add_argument("--stream-call-count", type=int, default=0,
                   help="close each stream after this many messages (the data's messages repeat); 0 = send them once")
    p.add_argument("--stream-call-duration", type=_duration, default=None,
                   help="close each stream after this long (the data's messages repeat)")
    p.add_argument("--stream-dynamic-messages", action="store_true",
                   help="render call templates for every message of a stream, not once per call")
    p.add_argument("--lockstep-field", default=None, metavar="FIELD",
                   help="bidi: after a message whose FIELD is set, wait for the reply echoing it before sending on, "
                        "and report each round trip (Speculator.Session: round_id)")
    p.add_argument("--listen", default=None, metavar="ADDRESS",
                   help="with --record-to: the address the recording proxy listens on")
    p.add_argument("--record-to", type=Path, default=None, metavar="FILE",
                   help="do not load: proxy --call's streams from --listen to the host and write each stream's "
                        "requests as one JSON line (a -D file)")
    p.add_argument("--record-streams", type=int, default=0,
                   help="with --record-to: stop after this many recorded streams (0 = until Ctrl-C)")
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
    if args.stream_call_count < 0:
        raise LoadTestError("--stream-call-count must be >= 0")
    if args.proto is not None and args.protoset is not None:
        raise LoadTestError("give --proto or --protoset, not both")
    return LoadOptions(host=args.host, call=args.call, data=args.data, data_file=args.data_file,
                       metadata=tuple((k.lower(), str(v)) for k, v in metadata.items()),
                       concurrency=args.concurrency, total=args.total, duration_s=args.duration, rps=args.rps,
                       connections=args.connections, timeout_s=args.timeout, is_insecure=args.insecure,
                       proto=args.proto, import_paths=tuple(Path(p) for p in args.import_paths.split(",") if p),
                       protoset=args.protoset, stream_interval_s=args.stream_interval,
                       stream_call_count=args.stream_call_count, stream_call_duration_s=args.stream_call_duration,
                       is_stream_dynamic=args.stream_dynamic_messages, lockstep_field=args.lockstep_field)


def main(args: argparse.Namespace) -> int:
    from loadtest.report import build_report, format_summary
    from loadtest.runner import run_load

    try:
        opts = options_from_args(args)
        if args.record_to is not None:
            return _record(args, opts)
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


def _record(args: argparse.Namespace, opts: LoadOptions) -> int:
    from loadtest.record import record_streams

    if not args.listen:
        raise LoadTestError("--record-to needs --listen ADDRESS (where the streams to record arrive)")
    try:
        num = asyncio.run(record_streams(opts, args.listen, args.record_to, args.record_streams or None))
    except KeyboardInterrupt:
        num = None
    sys.stderr.write(f"recorded {'the' if num is None else num} streams of {opts.call} into {args.record_to}\n")
    return 0
