"""Clients in other languages: the Node.js example (examples/node, @grpc/grpc-js + @grpc/proto-loader) streams
the same greedy text from the gateway's ssd.v1.Generation as the Python example, with the protos loaded
unchanged from their one proto root.

The npm packages are installed by the fixture (`npm ci` of examples/node's lock file into a cache folder keyed
by that file), so CI needs only node and npm; without them, or without the npm registry, the tests skip.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ssd.paths import cache_root
from tests.integration.conftest import API_KEY, MAX_TOKENS, PROMPTS

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
NODE_EXAMPLE = ROOT / "examples" / "node"
PYTHON_EXAMPLE = ROOT / "examples" / "python" / "stream_chat.py"
PACKAGE_FILES = ("package.json", "package-lock.json")


def _npm_ci(folder: Path, npm: str) -> None:
    """Install the locked packages into folder/node_modules; skip when the npm registry is unreachable."""
    try:
        ping = subprocess.run([npm, "ping", "--fetch-retries=0", "--fetch-timeout=15000"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip("the npm registry is unreachable (npm ping timed out)")
    if ping.returncode != 0:
        lines = ping.stderr.splitlines()
        reason = next((line for line in lines if "FetchError" in line), ping.stderr.strip())
        pytest.skip(f"the npm registry is unreachable: {reason}")
    staging = folder.with_name(folder.name + f".{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in PACKAGE_FILES:
        shutil.copy(NODE_EXAMPLE / name, staging / name)
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=staging, check=True,
                   capture_output=True, timeout=600)
    try:
        staging.rename(folder)  # whole or not at all: a cut-short install is never taken for a finished one
    except OSError:  # another run installed the same lock file first
        shutil.rmtree(staging)


@pytest.fixture(scope="session")  # session: it skips before the stack fixture starts processes
def node_modules() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed: the Node.js client cannot run here")
    locked = b"".join((NODE_EXAMPLE / name).read_bytes() for name in PACKAGE_FILES)
    folder = cache_root() / "node" / hashlib.sha256(locked).hexdigest()[:16]
    if not (folder / "node_modules").is_dir():
        _npm_ci(folder, npm)
    return folder / "node_modules"


def run_client(command: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


def node_client(node_modules: Path, *args: str) -> tuple[int, str, str]:
    return run_client(["node", str(NODE_EXAMPLE / "stream_chat.js"), *args], {"NODE_PATH": str(node_modules)})


def python_client(*args: str) -> tuple[int, str, str]:
    return run_client([sys.executable, str(PYTHON_EXAMPLE), *args], {"PYTHONPATH": str(ROOT)})


def test_proto_loader_loads_every_proto_from_the_one_proto_root(node_modules):
    script = ("const pl = require('@grpc/proto-loader'); const grpc = require('@grpc/grpc-js');"
              "const files = process.argv.slice(1);"
              "const ssd = grpc.loadPackageDefinition(pl.loadSync(files, {includeDirs: ['protos']})).ssd.v1;"
              "console.log(JSON.stringify(Object.keys(ssd).filter((k) => ssd[k].service).sort()));")
    proto_root = ROOT / "protos"
    files = [str(p.relative_to(proto_root)) for p in sorted((proto_root / "ssd" / "v1").glob("*.proto"))]
    code, out, err = run_client(["node", "-e", script, *files], {"NODE_PATH": str(node_modules)})
    assert code == 0, err
    assert json.loads(out) == ["Generation", "Speculator", "Verifier"]


def test_node_client_streams_the_python_clients_greedy_text(node_modules, stack, offline_greedy):
    prompt = PROMPTS[0]
    args = ["--address", stack.grpc_address, "--api-key", API_KEY, "--max-tokens", str(MAX_TOKENS),
            "--temperature", "0", prompt]
    py_code, py_text, py_err = python_client(*args)
    node_code, node_text, node_err = node_client(node_modules, *args)
    assert py_code == 0, py_err
    assert node_code == 0, node_err
    assert node_text == py_text == offline_greedy(prompt)
    summary = json.loads(node_err.strip().splitlines()[-1])
    assert summary["num_deltas"] > 1  # streamed, not one message
    assert summary["finish_reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_STOP")
    assert summary["usage"]["completion_tokens"] > 0


def test_node_client_without_the_api_key_is_refused(node_modules, stack):
    code, out, err = node_client(node_modules, "--address", stack.grpc_address, "--api-key", "wrong", "Hi")
    assert code == 1 and out == ""
    assert json.loads(err.strip().splitlines()[-1])["error"] == "UNAUTHENTICATED"
