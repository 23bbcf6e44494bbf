"""deploy/supervisor.py restarts an exited child with backoff; `ssd serve` keeps its key out of argv and banner."""

import argparse
import os
import signal

import pytest
from structlog.testing import capture_logs

from deploy.cli import add_serve_command, api_key, banner, masked
from deploy.local import Stack, StackConfig, spawn, stop_child
from deploy.supervisor import RestartPolicy, Supervisor
from ssd.config import EngineConfig

SLEEPER = ["timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"]  # a child that lives until killed


def test_an_exited_child_is_restarted_after_its_backoff_on_the_same_address():
    stack = Stack(StackConfig(EngineConfig("m")))
    child = spawn("draft", SLEEPER, "127.0.0.1:1", None, None)
    stack.children.append(child)
    supervisor = Supervisor(stack, RestartPolicy(initial_backoff_s=1.0, max_backoff_s=4.0, healthy_after_s=60.0))
    try:
        first = child.proc.pid
        os.kill(first, signal.SIGKILL)
        child.proc.wait()
        now = child.started_at + 1.0  # it exited quickly
        with capture_logs() as logs:
            supervisor.check(now)
            assert child.proc.pid == first  # backoff first
            supervisor.check(now + 1.0)
        assert child.proc.pid != first and child.proc.poll() is None and child.num_restarts == 1
        assert child.address == "127.0.0.1:1" and child.args == SLEEPER
        exited = next(e for e in logs if e["event"] == "service exited; restarting it")
        assert exited["service"] == "draft" and exited["exit_code"] == -signal.SIGKILL and exited["backoff_s"] == 1.0
        assert any(e["event"] == "restarted" and e["num_restarts"] == 1 for e in logs)
        os.kill(child.proc.pid, signal.SIGKILL)  # a second quick exit waits twice as long
        child.proc.wait()
        supervisor.check(child.started_at + 1.0)
        assert supervisor._restart_at["draft"] == pytest.approx(child.started_at + 3.0)
    finally:
        stop_child(child, grace_s=1)


def test_backoff_doubles_to_its_cap():
    stack = Stack(StackConfig(EngineConfig("m")))
    supervisor = Supervisor(stack, RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0))
    child = type("C", (), {"name": "x"})()
    waits = []
    for n in range(6):
        supervisor._quick_exits["x"] = n
        waits.append(supervisor.backoff_s(child))
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_the_api_key_comes_from_a_file_or_the_environment_and_the_banner_masks_it(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("\n  sk-very-secret-key  \n")
    assert api_key(serve_args("--api-key-file", str(key_file)), {}) == "sk-very-secret-key"
    assert api_key(serve_args(), {"SSD_API_KEY": "from-env-123"}) == "from-env-123"
    assert api_key(serve_args(), {}) is None
    text = banner("http://127.0.0.1:8000", "127.0.0.1:50050", "m", "sk-very-secret-key")
    assert "sk-very-secret-key" not in text and masked("sk-very-secret-key") in text
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SystemExit, match="empty"):
        api_key(serve_args("--api-key-file", str(tmp_path / "empty")), {})


def test_tls_flags_reach_every_child(tmp_path):
    from deploy.cli import stack_config

    config = stack_config(serve_args("--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"))
    assert config.tls.as_args() == ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"]
    with pytest.raises(SystemExit, match="go together"):
        stack_config(serve_args("--tls-cert", "c.pem"))
