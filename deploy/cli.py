"""`ssd serve`: flags -> StackConfig, start the stack, print how to call it, stop on Ctrl-C / SIGTERM."""

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ssd.cli_flags import add_dtype_flag, add_step_flags
from ssd.model_store import DEFAULT_DRAFT

if TYPE_CHECKING:
    from deploy.local import StackConfig  # imports grpc: only when serving


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="run draft, target and gateway services on localhost")
    s.add_argument("--model", default="smollm2-135m-instruct", help="target checkpoint folder or known model name")
    s.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="draft service: 'ngram', a draft checkpoint, an EAGLE-3 head folder, or 'none' (ar only)")
    add_dtype_flag(s, whose="the models'")
    s.add_argument("--device", default="cpu",
                   help="where draft and target run: cpu (a core each) or cuda / cuda:N (one GPU node)")
    add_step_flags(s)
    s.add_argument("--targets", type=int, default=1, help="target replicas")
    s.add_argument("--tensor-parallel-size", "--tp", type=int, default=1, dest="tensor_parallel_size",
                   help="CPU ranks (processes) each target's model is sharded over, one core each when there are "
                        "enough; must divide the model's attention and KV heads (the default model: 1 or 3)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address the gateway listens on (0.0.0.0 inside a container); model services stay on localhost")
    s.add_argument("--port", type=int, default=8000, help="HTTP port of the OpenAI-compatible API")
    s.add_argument("--grpc-port", type=int, default=50050, help="port of the public Generation gRPC API")
    s.add_argument("--k", type=int, default=4, help="lookahead K (a token tree's depth)")
    s.add_argument("--tree-budget", type=int, default=None,
                   help="sd requests speculate token trees of this many draft nodes (0 = chains; ssd stays chains); "
                        "default 8 with a neural draft, chains with n-gram lookup")
    s.add_argument("--default-mode", default="sd", choices=["ar", "sd", "ssd"],
                   help="mode of requests that name none (ssd: the draft answers from its speculation cache; "
                        "needs a neural --draft, an n-gram draft serves it as sd)")
    s.add_argument("--api-key", default=None, help="require this bearer key (default: auth off, local only)")
    s.add_argument("--log-dir", type=Path, default=None, help="write each service's log there")
    s.set_defaults(func=run_serve)


def stack_config(args: argparse.Namespace) -> "StackConfig":
    """The StackConfig `ssd serve` flags describe (a neural draft's sd requests get 8-node trees by default)."""
    from deploy.local import StackConfig, default_tree_budget  # noqa: PLC0415 - grpc only for this command

    draft = None if args.draft == "none" else args.draft
    tree_budget = default_tree_budget(draft) if args.tree_budget is None else args.tree_budget
    return StackConfig(model=args.model, draft=draft, dtype=args.dtype, device=args.device, num_targets=args.targets,
                       tensor_parallel_size=args.tensor_parallel_size, compile=args.compile,
                       enforce_eager=args.enforce_eager, attention_backend=args.attention_backend,
                       host=args.host, http_port=args.port, grpc_port=args.grpc_port, k=args.k, tree_budget=tree_budget,
                       default_mode=args.default_mode, api_key=args.api_key, log_dir=args.log_dir)


def run_serve(args: argparse.Namespace) -> int:
    from deploy.local import start_stack, stop_stack  # noqa: PLC0415 - grpc only for this command

    config = stack_config(args)
    if config.log_dir is not None:
        config.log_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stack = start_stack(config)
    auth = f' -H "Authorization: Bearer {args.api_key}"' if args.api_key else ""
    sys.stdout.write(
        f"\nssd-serve is up: {stack.url}  (gRPC ssd.v1.Generation on {stack.grpc_address})\n\n"
        f"  curl {stack.url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
        f"    -d '{{\"model\": \"{args.model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi!\"}}], "
        f"\"max_tokens\": 32}}'\n\nCtrl-C stops it.\n")
    sys.stdout.flush()
    try:
        while not stop.is_set() and all(c.proc.poll() is None for c in stack.children):
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop_stack(stack)
    return 0
