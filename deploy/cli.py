"""`ssd serve`: flags -> StackConfig, start the stack, print how to call it, supervise it (a child that exits is
restarted), stop on Ctrl-C / SIGTERM (each child drains its in-flight requests within its grace period).

The API key comes from a file (--api-key-file) or the environment (SSD_API_KEY) so it never shows in `ps`;
the banner masks it. A known model that is not cached is pulled first unless --offline / SSD_OFFLINE=1.
Each service logs to a file of its own (--log-dir, default a fresh folder under the cache); a start that
fails is one line naming the service, the cause and that file.
"""

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rpc.tls_files import TlsConfigError, TlsFiles, add_tls_flags, tls_files
from ssd.cli_flags import STEP_FIELDS, add_config_flags, options_from_args
from ssd.config import EngineConfig
from ssd.fetch import is_offline
from ssd.model_store import DEFAULT_DRAFT
from ssd.paths import cache_root

if TYPE_CHECKING:
    from deploy.local import StackConfig  # imports grpc: only when serving


SERVE_ENGINE_FIELDS = ("dtype", "quantization", "device", "tensor_parallel_size", *STEP_FIELDS)  # the targets' (drafts: dtype, device)


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="run draft, target and gateway services on localhost")
    s.add_argument("--model", default="smollm2-135m-instruct", help="target checkpoint folder or known model name")
    s.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="draft service: 'ngram', a draft checkpoint, an EAGLE-3 head folder, or 'none' (ar only)")
    add_config_flags(s, SERVE_ENGINE_FIELDS, whose="the models'", overrides={
        "device": {"help": "where draft and target run: cpu (a core each) or cuda / cuda:N (one GPU node)"},
        "tensor_parallel_size": {"help": "CPU ranks (processes) each target's model is sharded over, one core each "
                                 "when there are enough; must divide the model's attention and KV heads (the default "
                                 "model: 1 or 3)"}})
    s.add_argument("--targets", type=int, default=1, help="target replicas")
    s.add_argument("--drafts", type=_at_least_one, default=1,
                   help="draft services (same --draft each); every target spreads its sequences over the healthy ones "
                        "and moves a dead draft's sequences to another")
    s.add_argument("--host", default="127.0.0.1",
                   help="address the gateway listens on (0.0.0.0 inside a container); model services stay on localhost")
    s.add_argument("--port", type=int, default=8000, help="HTTP port of the OpenAI-compatible API")
    s.add_argument("--grpc-port", type=int, default=50050, help="port of the public Generation gRPC API")
    s.add_argument("--metrics-port", type=int, default=0,
                   help="Prometheus /metrics of the model services: draft i on port + i, target i on port + DRAFTS "
                        "+ i (0 = free ports; the banner lists them; the gateway's is on --port)")
    s.add_argument("--k", type=int, default=4, help="lookahead K (a token tree's depth)")
    s.add_argument("--tree-budget", type=int, default=None,
                   help="sd requests speculate token trees of this many draft nodes (0 = chains; ssd stays chains); "
                        "default 8 with a neural draft, chains with n-gram lookup")
    s.add_argument("--default-mode", default="sd", choices=["ar", "sd", "ssd"],
                   help="mode of requests that name none (ssd: the draft answers from its speculation cache; "
                        "needs a neural --draft, an n-gram draft serves it as sd)")
    s.add_argument("--adaptive", action="store_true",
                   help="requests that name no mode speculate only in batches where the target measured it faster "
                        "than plain steps (a request's mode 'auto' asks for that itself)")
    s.add_argument("--api-key", default=None,
                   help="require this bearer key (visible in `ps`: prefer --api-key-file or SSD_API_KEY)")
    s.add_argument("--api-key-file", type=Path, default=None,
                   help="require the bearer key in this file (its first line); default: SSD_API_KEY, else auth off")
    add_tls_flags(s, os.environ)
    s.add_argument("--log-dir", type=Path, default=None,
                   help="write each service's log there (default: a new folder under ~/.cache/ssd-serve/logs)")
    s.add_argument("--offline", action="store_true",
                   help="never download: a model that is not cached is an error (also SSD_OFFLINE=1)")
    s.set_defaults(func=run_serve)


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def stack_config(args: argparse.Namespace) -> "StackConfig":
    """The StackConfig `ssd serve` flags describe (a neural draft's sd requests get 8-node trees by default)."""
    from deploy.local import StackConfig, default_tree_budget  # noqa: PLC0415 - grpc only for this command

    draft = None if args.draft == "none" else args.draft
    tree_budget = default_tree_budget(draft) if args.tree_budget is None else args.tree_budget
    target = EngineConfig(args.model, **options_from_args(args, SERVE_ENGINE_FIELDS))
    return StackConfig(target, draft=draft, num_targets=args.targets, num_drafts=args.drafts, host=args.host,
                       http_port=args.port, grpc_port=args.grpc_port, k=args.k, tree_budget=tree_budget,
                       default_mode=args.default_mode, adaptive=args.adaptive, api_key=api_key(args, os.environ),
                       log_dir=args.log_dir or default_log_dir(), tls=_tls(args), metrics_port=args.metrics_port,
                       offline=args.offline or is_offline())


def default_log_dir() -> Path:
    """A fresh folder per `ssd serve` run: $SSD_CACHE/logs/serve-YYYYmmdd-HHMMSS."""
    return cache_root() / "logs" / time.strftime("serve-%Y%m%d-%H%M%S")


def _tls(args: argparse.Namespace) -> TlsFiles:
    """The TLS files for every hop; a half-given pair exits with one line."""
    try:
        return tls_files(args)
    except TlsConfigError as e:
        raise SystemExit(f"ssd serve: {e}") from e


def api_key(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """--api-key-file's first line, else --api-key, else SSD_API_KEY; None = authentication off."""
    if args.api_key_file is not None:
        try:
            lines = [line.strip() for line in args.api_key_file.read_text().splitlines() if line.strip()]
        except OSError as e:
            raise SystemExit(f"ssd serve: cannot read --api-key-file {args.api_key_file}: {e.strerror}") from e
        if not lines:
            raise SystemExit(f"ssd serve: --api-key-file {args.api_key_file} is empty")
        return lines[0]
    return args.api_key or env.get("SSD_API_KEY") or None


def masked(key: str) -> str:
    """What the banner shows of a key: its first 4 characters at most."""
    return key[:4] + "..." if len(key) > 8 else "***"


def run_serve(args: argparse.Namespace) -> int:
    from deploy.local import StackStartError, start_stack, stop_stack  # noqa: PLC0415 - grpc only here
    from deploy.supervisor import Supervisor  # noqa: PLC0415
    from rpc.server import PortInUseError  # noqa: PLC0415

    config = stack_config(args)
    if args.api_key is not None:
        sys.stderr.write("ssd serve: warning: --api-key is visible to every user in `ps`; use --api-key-file or "
                         "SSD_API_KEY\n")
    if config.api_key is None:
        sys.stderr.write("ssd serve: warning: authentication is OFF (no --api-key-file / SSD_API_KEY): anyone who "
                         f"reaches {config.host}:{config.http_port} can use the API\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stack = start_stack(config)
    except (PortInUseError, StackStartError) as e:  # one clear line, a non-zero exit
        sys.stderr.write(f"ssd serve: cannot start: {e}\n")
        return 1
    sys.stdout.write(banner(stack.url, stack.grpc_address, args.model, config.api_key,
                            [c.metrics_url for c in stack.children if c.metrics_url]))
    sys.stdout.write(f"Service logs: {config.log_dir}\n")
    sys.stdout.flush()
    try:
        Supervisor(stack).run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        stop_stack(stack)
    return 0


def banner(url: str, grpc_address: str, model: str, key: str | None, metrics_urls: Sequence[str] = ()) -> str:
    """How to call the stack; the key masked (the caller has it); where Prometheus scrapes each service."""
    auth = f' -H "Authorization: Bearer {masked(key)}"' if key else ""
    metrics = f"Prometheus /metrics: {'  '.join(metrics_urls)}\n" if metrics_urls else ""
    return (f"\nssd-serve is up: {url}  (gRPC ssd.v1.Generation on {grpc_address})\n\n"
            f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
            f"    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi!\"}}], "
            f"\"max_tokens\": 32}}'\n\n{metrics}A service that exits is restarted. Ctrl-C stops it.\n")
