"""Models on demand, fast (no model, no network): ensure_model pulls a known model only when it is missing and
not offline; offline mode never starts pip; pip's raw progress lines are consumed; a failed start names the
service, its log's last error and the log file."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from deploy import local
from deploy.cli import add_serve_command, stack_config
from deploy.local import Child, StackConfig, StackStartError, last_error, start_stack
from ssd import fetch, model_store
from ssd.config import EngineConfig
from ssd.errors import FetchError, ModelNotFoundError
from ssd.fetch import is_offline, pip_download
from ssd.model_store import DEFAULT_MODEL, MANIFEST_NAME, ensure_model


@pytest.fixture(autouse=True)
def _fresh_logging():
    """`ssd` configures structlog onto the captured stderr; later tests must not write to it once closed."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SSD_OFFLINE", "0")  # restored after the test, even when `ssd --offline` set it
    return tmp_path / "cache"


@pytest.fixture
def pulls(monkeypatch) -> list[str]:
    """Replace the pull with one that writes an (empty) cached folder and records the name."""
    names: list[str] = []

    def fake_pull(name: str, *, force: bool = False) -> Path:
        names.append(name)
        folder = model_store.models_dir() / name
        folder.mkdir(parents=True)
        (folder / MANIFEST_NAME).write_text("{}")
        return folder

    monkeypatch.setattr(model_store, "pull", fake_pull)
    return names


def test_ensure_model_pulls_a_known_model_once(empty_cache, pulls):
    folder = ensure_model(DEFAULT_MODEL)
    assert folder == empty_cache / "models" / DEFAULT_MODEL
    assert ensure_model(DEFAULT_MODEL) == folder
    assert pulls == [DEFAULT_MODEL]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_offline_never_pulls_and_says_how_to_get_the_model(empty_cache, pulls, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("SSD_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=f"offline mode is on.*ssd models pull {DEFAULT_MODEL}"):
        ensure_model(DEFAULT_MODEL, offline=True if how == "argument" else None)
    assert pulls == []


def test_folders_and_unknown_names_are_never_pulled(empty_cache, pulls, tmp_path):
    assert ensure_model(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(ModelNotFoundError, match="neither a model folder nor a known model name"):
        ensure_model("no-such-model")
    assert pulls == []


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_is_offline_reads_ssd_offline(value, expected):
    assert is_offline({"SSD_OFFLINE": value}) is expected


def test_offline_pip_download_never_runs_pip(empty_cache, monkeypatch):
    monkeypatch.setenv("SSD_OFFLINE", "1")
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    monkeypatch.setattr(fetch.subprocess, "Popen", lambda *a, **k: pytest.fail("pip ran"))
    with pytest.raises(FetchError, match="offline mode is on"):
        pip_download("foo-bar==1.0")


def test_raw_progress_lines_are_consumed_and_the_rest_kept():
    script = "print('Progress 0 of 10'); print('Progress 10 of 10'); print('Saved x.whl'); raise SystemExit(3)"
    returncode, output = fetch._run_with_progress("x==1", [sys.executable, "-c", script])
    assert returncode == 3
    assert output == "Saved x.whl"


def test_last_error_prefers_the_last_json_error_after_the_offset(tmp_path):
    log = tmp_path / "target-0.log"
    old = json.dumps({"event": "old run", "level": "error", "error": "stale"}) + "\n"
    log.write_text(old + json.dumps({"event": "loading", "level": "info"}) + "\n"
                   + json.dumps({"event": "cannot start the target", "level": "error", "error": "no model"}) + "\n"
                   + json.dumps({"event": "bye", "level": "info"}) + "\n")
    assert last_error(log, len(old)) == "cannot start the target: no model"
    log.write_text("Traceback (most recent call last):\n  File x\nValueError: boom\n\n")
    assert last_error(log) == "ValueError: boom"
    assert last_error(tmp_path / "missing.log") is None


def test_child_failure_is_one_line_with_the_log(tmp_path):
    (tmp_path / "draft.log").write_text(json.dumps({"event": "cannot load the draft", "level": "error",
                                                    "error": "bad head"}) + "\n")
    child = Child("draft", subprocess.Popen(["true"]), "127.0.0.1:1", log_dir=tmp_path)
    child.proc.wait()
    line = child.failure("exited with code 2 while starting")
    assert line == (f"draft exited with code 2 while starting: cannot load the draft: bad head "
                    f"(log: {tmp_path / 'draft.log'})")


def test_an_offline_stack_without_its_model_fails_before_any_service_starts(empty_cache, monkeypatch):
    monkeypatch.setattr(local, "spawn", lambda *a, **k: pytest.fail("a service was started"))
    config = StackConfig(EngineConfig(DEFAULT_MODEL), draft="ngram", offline=True, http_port=local.free_port(),
                         grpc_port=local.free_port())
    with pytest.raises(StackStartError, match=f"^target model: model '{DEFAULT_MODEL}' is not downloaded"):
        start_stack(config)


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_flags_offline_and_a_log_dir_under_the_cache(empty_cache, monkeypatch):
    config = stack_config(_serve_args())
    assert config.offline is False
    assert config.log_dir.parent == empty_cache / "logs"
    assert stack_config(_serve_args("--offline")).offline is True
    monkeypatch.setenv("SSD_OFFLINE", "1")
    assert stack_config(_serve_args()).offline is True
    assert stack_config(_serve_args("--log-dir", "/tmp/x")).log_dir == Path("/tmp/x")


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["bench"]])
def test_cli_commands_offline_fail_with_one_line(empty_cache, pulls, capsys, command):
    from cli.main import main

    assert main([*command, "--offline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model") and "offline mode is on" in err[0]
    assert pulls == []


def test_cli_generate_pulls_a_missing_model_first(empty_cache, pulls, monkeypatch):
    from cli import main as cli_main

    monkeypatch.setattr(cli_main, "_cmd_generate", lambda args: 0)
    parser = cli_main.build_parser()
    args = parser.parse_args(["generate", "--prompt", "hi"])
    cli_main._pull_on_demand(args)
    assert pulls == [DEFAULT_MODEL]
