"""Teacher-forced corpus data: fixed windows of real text (standard-library source, package descriptions)
run through the target once, no generation. Much cheaper per position than self-distilled answers, and the
target's top-k distribution is still the label; it widens the data when generation is slow.

Shards use the layout of data_gen.py with prompt_len 0 (every position is trained at full weight).
"""

import json
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog
from tqdm.auto import tqdm

from draft_training.data_gen import save_shard
from draft_training.target_features import TargetFeatureExtractor
from ssd.dtypes import parse_dtype
from ssd.errors import InvalidRequestError
from ssd.tokenizer import load_tokenizer

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CorpusConfig:
    target: str
    aux_layers: tuple[int, int, int]
    seed: int = 0
    num_windows: int = 512
    window_tokens: int = 384
    top_k: int = 16
    shard_size: int = 32  # windows per shard
    dtype: str = "auto"  # the target's: bfloat16 where the CPU runs it natively, else float32


def corpus_texts() -> list[str]:
    """Standard-library .py files and installed packages' METADATA descriptions, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(stdlib.glob("*.py"))
    for root in sorted({Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()}):
        paths += sorted(root.glob("*.dist-info/METADATA"))
    texts = []
    for path in paths:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def build_windows(config: CorpusConfig, encode) -> list[list[int]]:  # type: ignore[no-untyped-def]
    rng = random.Random(config.seed)
    texts = corpus_texts()
    rng.shuffle(texts)
    windows: list[list[int]] = []
    for text in texts:
        ids = encode(text[:200_000])
        starts = list(range(0, max(1, len(ids) - config.window_tokens), config.window_tokens))
        for start in rng.sample(starts, min(2, len(starts))):  # at most two windows a file: keep it varied
            window = ids[start : start + config.window_tokens]
            if len(window) >= 64:
                windows.append(window)
        if len(windows) >= config.num_windows:
            break
    return windows[: config.num_windows]


def generate_corpus_data(config: CorpusConfig, cache: Path) -> list[Path]:
    """Fill `cache` with the corpus shards (resumable); returns their paths in order."""
    cache = Path(cache)
    want = {**asdict(config), "aux_layers": list(config.aux_layers)}
    want.pop("num_windows")  # windows are a fixed prefix-stable list: more windows only add shards
    manifest = cache / "manifest.json"
    have = json.loads(manifest.read_text()) if manifest.is_file() else want
    have.pop("num_windows", None)
    if have != want:
        raise InvalidRequestError(f"{cache} holds corpus data built with other options; delete it or change it")
    cache.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(want, indent=2) + "\n")
    num_shards = -(-config.num_windows // config.shard_size)
    paths = [cache / f"corpus-{i:05d}.safetensors" for i in range(num_shards)]
    todo = [i for i, p in enumerate(paths) if not p.is_file()]
    if not todo:
        return paths
    tokenizer = load_tokenizer(Path(config.target))
    if tokenizer is None:
        raise InvalidRequestError(f"{config.target} has no tokenizer; corpus data needs one")
    windows = build_windows(config, tokenizer.encode)
    paths = paths[: -(-len(windows) // config.shard_size)]
    extractor = TargetFeatureExtractor(Path(config.target), parse_dtype(config.dtype), config.aux_layers,
                                       max_batch_tokens=2048)
    for i in tqdm([i for i in todo if i < len(paths)], desc="corpus data (shards)", unit="shard"):
        started = time.perf_counter()
        group = windows[i * config.shard_size : (i + 1) * config.shard_size]
        num = save_shard(paths[i], extractor.capture(group, [0] * len(group), config.top_k))
        log.info("corpus shard written", shard=i, tokens=num, seconds=round(time.perf_counter() - started, 1))
    return paths
