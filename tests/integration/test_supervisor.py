"""`ssd serve` as a process: a busy port is one clear line and a non-zero exit; no key is a loud warning."""

import socket
import subprocess
import sys

import pytest


def _serve(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "serve", "--draft", "none", *argv], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("flag", ["--port", "--grpc-port"])
def test_serve_on_a_busy_port_exits_non_zero_with_one_clear_line(flag):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _serve(flag, str(port))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "ssd-serve is up" not in done.stdout
    assert "authentication is OFF" in done.stderr  # no key was given
