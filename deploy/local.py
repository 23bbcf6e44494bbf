"""`ssd serve`: start draft(s), target(s) and gateway as processes on localhost, wait until healthy, stop cleanly.

On CPU each model service is pinned to a core of its own (os.sched_setaffinity) with one torch
thread. Children are stopped by their pids (SIGTERM, then SIGKILL after a grace period). Each Child
keeps how it was started, so deploy/supervisor.py can start it again on the same address.

A known model that is not cached is pulled first, by the launcher (once, with a progress bar), unless
the stack is offline. A start that fails raises StackStartError: one line naming the service, the cause
(its log's last error) and the log file.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rpc.ports import free_port
from rpc.server import check_port_free
from rpc.tls import sync_channel
from rpc.tls_files import TlsFiles
from ssd.cli_flags import STEP_FIELDS, config_flag_args
from ssd.config import EngineConfig
from ssd.errors import SSDError
from ssd.fetch import OFFLINE_ENV
from ssd.layers import cpu_kernels
from ssd.model_store import ensure_model

log = structlog.get_logger(__name__)


NEURAL_TREE_BUDGET = 8  # sd's fastest shape measured with the shipped EAGLE-3 head (docs/benchmarks.md)


def default_tree_budget(draft: str | None) -> int:
    """Token trees of NEURAL_TREE_BUDGET nodes for a neural draft's sd requests; chains for n-gram lookup
    (its trees were never measured faster) and without a draft."""
    return 0 if draft in (None, "ngram") else NEURAL_TREE_BUDGET


# the targets' engine settings a stack passes on (the service's own defaults for the rest, e.g. 1 thread)
TARGET_ENGINE_FIELDS = ("dtype", "quantization", "device", "tensor_parallel_size", "enable_prefix_caching",
                        "block_size", *STEP_FIELDS)


@dataclass(frozen=True)
class StackConfig:
    # the targets' engine, passed as their flags (TARGET_ENGINE_FIELDS): model, dtype, quantization, device (cpu: a
    # core each; cuda / cuda:N: tensors by CUDA IPC), tensor parallel ranks (one core each where there are enough),
    # step settings, prefix caching, block size. The drafts run on its dtype, device and block size.
    target: EngineConfig
    draft: str | None = "ngram"  # None = no draft service (ar only)
    num_targets: int = 1
    num_drafts: int = 1  # draft services; every target spreads its sequences over all of them
    host: str = "127.0.0.1"  # where the gateway listens (0.0.0.0 in a container); the model services stay local
    http_port: int = 8000
    grpc_port: int = 50050
    k: int = 4  # lookahead K (a token tree's depth)
    tree_budget: int = 0  # sd requests speculate token trees of this many nodes; 0 = chains (see default_tree_budget)
    default_mode: str = "sd"
    adaptive: bool = False  # requests that name no mode speculate only where the target measured it faster
    api_key: str | None = None  # None = auth disabled (local use)
    log_dir: Path | None = None  # service logs; None = inherit stderr
    draft_timeout_s: float = 5.0
    health_interval_s: float = 0.5  # gateway's target polling period
    metrics_port: int = 0  # model services' /metrics: draft i on port + i, target i on port + num_drafts + i; 0 = free
    tls: TlsFiles = field(default_factory=TlsFiles)  # one certificate for every hop; no files = plaintext
    offline: bool = False  # never pull a model: one not cached fails the start (the children get SSD_OFFLINE=1)


class StackStartError(RuntimeError):
    """A service of the stack could not start; the message is one line: service, cause, log."""


class StackStartTimeout(StackStartError, TimeoutError):
    """Services did not report SERVING in time."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    address: str  # gRPC host:port (health)
    args: list[str] = field(default_factory=list)  # `python -m` arguments it was started with
    core: int | tuple[int, ...] | None = None
    log_dir: Path | None = None
    extra_env: dict[str, str] | None = None
    started_at: float = field(default_factory=time.monotonic)
    num_restarts: int = 0
    metrics_url: str | None = None  # its Prometheus /metrics (model services: --metrics-port; the gateway's HTTP)
    log_start: int = 0  # where this run's output begins in its log file

    @property
    def log_path(self) -> Path | None:
        return self.log_dir / f"{self.name}.log" if self.log_dir is not None else None

    def failure(self, what: str) -> str:
        """One line: `what` happened to this child, the last error its log shows, and where the log is."""
        cause = last_error(self.log_path, self.log_start) if self.log_path is not None else None
        where = f"log: {self.log_path}" if self.log_path is not None else "its output is above"
        return f"{self.name} {what}" + (f": {cause}" if cause else "") + f" ({where})"


@dataclass
class Stack:
    config: StackConfig
    children: list[Child] = field(default_factory=list)
    draft_addresses: list[str] = field(default_factory=list)  # draft i's address ("draft", "draft-1", ...)
    target_addresses: list[str] = field(default_factory=list)

    @property
    def draft_address(self) -> str | None:
        """The first draft's address (None: no draft)."""
        return self.draft_addresses[0] if self.draft_addresses else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.config.grpc_port}"

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _popen(name: str, args: list[str], core: int | tuple[int, ...] | None, log_dir: Path | None,
           extra_env: dict[str, str] | None) -> subprocess.Popen:
    out = open(log_dir / f"{name}.log", "ab") if log_dir is not None else None  # noqa: SIM115 - owned by the child
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    cores = {core} if isinstance(core, int) else set(core or ())
    preexec = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    try:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT if out else None,
                                env=env, preexec_fn=preexec, start_new_session=True)
    finally:
        if out is not None:
            out.close()  # the child has its own descriptor


def _log_size(log_dir: Path | None, name: str) -> int:
    try:
        return (log_dir / f"{name}.log").stat().st_size if log_dir is not None else 0
    except FileNotFoundError:
        return 0


def spawn(name: str, args: list[str], address: str, core: int | tuple[int, ...] | None, log_dir: Path | None,
          extra_env: dict[str, str] | None = None) -> Child:
    """Start `python -m <args>`; pin it to `core` (or cores) when given (model services also get --threads 1)."""
    log_start = _log_size(log_dir, name)
    proc = _popen(name, args, core, log_dir, extra_env)
    log.info("started", service=name, pid=proc.pid, address=address, core=core)
    return Child(name, proc, address, list(args), core, log_dir, extra_env, log_start=log_start)


def respawn(child: Child) -> None:
    """Start an exited child again, the same way and on the same address (its peers reconnect to it)."""
    child.log_start = _log_size(child.log_dir, child.name)
    child.proc = _popen(child.name, child.args, child.core, child.log_dir, child.extra_env)
    child.started_at = time.monotonic()
    child.num_restarts += 1
    log.info("restarted", service=child.name, pid=child.proc.pid, address=child.address,
             num_restarts=child.num_restarts)


def draft_name(index: int) -> str:
    """The first draft is "draft" (one draft: the only one), the others "draft-1", "draft-2", ..."""
    return "draft" if index == 0 else f"draft-{index}"


def start_draft(stack: Stack, core: int | None, port: int | None = None, index: int = 0) -> Child:
    """Draft `index`, on the address it had before if it ran already (its targets reconnect to it). A checkpoint
    draft also gets the target model: an EAGLE-3 head needs its embedding and config."""
    c = stack.config
    if index == len(stack.draft_addresses):
        stack.draft_addresses.append(f"127.0.0.1:{port or free_port()}")
    address = stack.draft_addresses[index]
    metrics_port = _metrics_port(c, index)
    args = ["draft_service", "--draft", c.draft, "--address", address, "--threads", "1",
            *config_flag_args(c.target, ("dtype", "device", "block_size")), "--metrics-port", str(metrics_port),
            *c.tls.as_args()]
    if c.draft != "ngram":
        args += ["--target-model", c.target.model]
    child = spawn(draft_name(index), args, address, core, c.log_dir, _offline_env(c))
    child.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    stack.children.append(child)
    return child


def _metrics_port(config: StackConfig, offset: int) -> int:
    return config.metrics_port + offset if config.metrics_port else free_port()


def start_target(stack: Stack, index: int, core: int | tuple[int, ...] | None) -> Child:
    """A target; with tensor parallelism its ranks pin themselves to one core each of the cores it gets."""
    c = stack.config
    address, metrics_port = f"127.0.0.1:{free_port()}", _metrics_port(c, c.num_drafts + index)
    args = ["target_service", "--model", c.target.model, "--address", address, "--replica-id", f"target-{index}",
            "--metrics-port", str(metrics_port), "--threads", "1", *config_flag_args(c.target, TARGET_ENGINE_FIELDS),
            "--k", str(c.k), "--default-mode", c.default_mode, "--tree-budget", str(c.tree_budget),
            "--draft-timeout-s", str(c.draft_timeout_s), *(["--adaptive"] if c.adaptive else []), *c.tls.as_args()]
    for draft_address in stack.draft_addresses:
        args += ["--draft-address", draft_address]
    child = spawn(f"target-{index}", args, address, core, c.log_dir, _offline_env(c))
    child.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    stack.children.append(child)
    stack.target_addresses.append(address)
    return child


def _offline_env(config: StackConfig) -> dict[str, str] | None:
    return {OFFLINE_ENV: "1"} if config.offline else None


def start_gateway(stack: Stack) -> Child:
    c = stack.config
    args = ["gateway", "--http-address", f"{c.host}:{c.http_port}", "--grpc-address", f"{c.host}:{c.grpc_port}",
            "--health-interval-s", str(c.health_interval_s), *c.tls.as_args()]
    for address in stack.target_addresses:
        args += ["--target", address]
    if c.api_key is None:
        args.append("--no-auth")
    env = {"SSD_API_KEYS": c.api_key} if c.api_key is not None else None  # never on the command line
    child = spawn("gateway", args, stack.grpc_address, None, c.log_dir, env)
    child.metrics_url = stack.url + "/metrics"
    stack.children.append(child)
    return child


def is_serving(address: str, timeout_s: float = 1.0, tls: TlsFiles | None = None) -> bool:
    with sync_channel(address, tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def wait_healthy(children: list[Child], timeout_s: float, tls: TlsFiles | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(children)
    while pending:
        for child in list(pending):
            if child.proc.poll() is not None:
                raise StackStartError(child.failure(f"exited with code {child.proc.returncode} while starting"))
            if is_serving(child.address, tls=tls):
                pending.remove(child)
        if pending and time.monotonic() > deadline:
            raise StackStartTimeout(pending[0].failure(f"was not healthy after {timeout_s:.0f} s"))
        time.sleep(0.2)


def last_error(log_path: Path, start: int = 0) -> str | None:
    """The last error in a service's log from byte `start` on: its last JSON line at level error (`event: error`),
    else its last line (a traceback ends with the exception); None for an empty or missing log."""
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("level") in ("error", "critical"):
            parts = [str(event.get("event", "")), str(event.get("error", ""))]
            return ": ".join(p for p in parts if p)[:500]
    return lines[-1][:500] if lines else None


def ensure_models(config: StackConfig) -> None:
    """Pull the stack's known models that are not cached yet (unless offline), before any service starts, so
    the services never pull at once. Raises StackStartError, naming the model's role, when one is missing."""
    roles = [("target model", config.target.model)]
    if config.draft not in (None, "ngram"):
        roles.append(("draft", config.draft))
    for role, name in roles:
        try:
            ensure_model(name, offline=config.offline)
        except SSDError as e:
            raise StackStartError(f"{role}: {e}") from None


def start_stack(config: StackConfig, timeout_s: float = 180.0) -> Stack:
    """Start every service and return once all report SERVING (and the gateway sees a target)."""
    for port in (config.http_port, config.grpc_port):  # the gateway's public ports: fail now, in one line
        check_port_free(f"{config.host}:{port}")
    ensure_models(config)
    if config.target.device == "cpu":  # build the CPU kernels here, once (minutes on a new machine), so that no
        cpu_kernels.extension()  # service spends its start-up wait compiling them
    if config.log_dir is not None:
        config.log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(config)
    cores = _cores() if config.target.device == "cpu" else []  # on a GPU the services are not pinned
    next_core = iter(cores if len(cores) > 1 else [])
    try:
        if config.draft is not None:
            for i in range(config.num_drafts):
                start_draft(stack, next(next_core, None), index=i)
        for i in range(config.num_targets):
            start_target(stack, i, _take(next_core, config.target.tensor_parallel_size))
        start_gateway(stack)
        services = [c for c in stack.children if c.name != "gateway"]
        wait_healthy(services, timeout_s, config.tls)  # over TLS when the stack has it
        wait_healthy([c for c in stack.children if c.name == "gateway"], timeout_s)  # the public API: plaintext
        _wait_http(stack.url + "/health", timeout_s)
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def _take(cores: Iterator[int], n: int) -> int | tuple[int, ...] | None:
    """The next `n` cores (one: an int); None when fewer are left (the process then runs unpinned)."""
    taken = tuple(itertools.islice(cores, n))
    if len(taken) < n:
        return None
    return taken[0] if n == 1 else taken


def _wait_http(url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise StackStartTimeout(f"gateway: {url} not healthy after {timeout_s:.0f} s")


def stop_child(child: Child, grace_s: float = 10.0) -> None:
    if child.proc.poll() is None:
        child.proc.send_signal(signal.SIGTERM)
        try:
            child.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("did not stop in time; killing", service=child.name, pid=child.proc.pid)
            child.proc.kill()
            child.proc.wait()


def stop_stack(stack: Stack, grace_s: float = 10.0) -> None:
    """Gateway first (no new requests), then targets, then the drafts; each by its pid."""
    for child in reversed(stack.children):
        stop_child(child, grace_s)
    log.info("stack stopped")
