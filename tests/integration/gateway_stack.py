"""A real gateway process in front of the fake target (tests/integration/fake_target.py), for the gateway's
reliability tests: fast to start, no model weights (the default model's tokenizer files only)."""

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from deploy.local import free_port, is_serving

ROOT = Path(__file__).resolve().parents[2]  # the processes run from the repository root
API_KEY = "fake-stack-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass(frozen=True)
class FakeStack:
    url: str  # the gateway's HTTP base URL
    grpc_address: str  # the gateway's Generation API
    gateway: subprocess.Popen
    log_path: Path  # the gateway's stderr


def _start(args: list[str], log_path: Path) -> subprocess.Popen:
    out = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)


def _wait_ready(url: str, procs: list[subprocess.Popen], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a fake-stack process exited while starting")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError("the fake stack did not become healthy")


@contextlib.contextmanager
def fake_stack(tmp: Path, model_dir: Path, gateway_flags: tuple[str, ...] = (), num_tokens: int = 4,
               token_delay_s: float = 0.01) -> Iterator[FakeStack]:
    target = f"127.0.0.1:{free_port()}"
    http_port, grpc_address = free_port(), f"127.0.0.1:{free_port()}"
    (tmp / "keys").write_text(API_KEY + "\n")
    procs = [_start(["tests.integration.fake_target", "--address", target, "--model-dir", str(model_dir),
                     "--num-tokens", str(num_tokens), "--token-delay-s", str(token_delay_s)], tmp / "target.log")]
    try:
        deadline = time.monotonic() + 60
        while not is_serving(target):
            if procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the fake target did not start")
            time.sleep(0.2)
        procs.append(_start(["gateway", "--target", target, "--http-address", f"127.0.0.1:{http_port}",
                             "--grpc-address", grpc_address, "--api-key-file", str(tmp / "keys"),
                             "--health-interval-s", "0.2", *gateway_flags], tmp / "gateway.log"))
        url = f"http://127.0.0.1:{http_port}"
        _wait_ready(url, procs)
        yield FakeStack(url, grpc_address, procs[1], tmp / "gateway.log")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
