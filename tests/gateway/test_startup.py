"""The gateway process at start-up: a taken HTTP port is one clear error line and exit status 2."""

import json
import socket
import subprocess
import sys
from pathlib import Path

from rpc.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_taken_http_port_is_one_clear_error_and_exit_status_2():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        http_address = f"127.0.0.1:{holder.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-m", "gateway", "--target", f"127.0.0.1:{free_port()}", "--no-auth",
                               "--http-address", http_address, "--grpc-address", f"127.0.0.1:{free_port()}"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    errors = [json.loads(line) for line in done.stderr.splitlines() if '"level": "error"' in line]
    assert [e["event"] for e in errors] == ["cannot start the gateway"]
    assert http_address in errors[0]["error"] and "in use" in errors[0]["error"]
    assert "Traceback" not in done.stderr
