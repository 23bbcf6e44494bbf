"""Self-distillation data: the target answers the training prompts, and the forwards that generate the answers
also capture its features and top-k next-token log-probabilities (capture_generation.py), stored as shards on
disk.

Resumable: each shard (a fixed slice of the deterministic prompt list) is written atomically and skipped
when present; the cache folder's manifest must match the options, so a stale cache is never mixed in.
"""

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from draft_training.capture_generation import generate_captured
from draft_training.prompts import TrainingPrompt, build_training_prompts
from draft_training.target_features import CapturedSequence, TargetFeatureExtractor
from ssd.dtypes import parse_dtype
from ssd.errors import InvalidRequestError
from ssd.model_config import load_model_config
from ssd.models.eagle3 import default_aux_layers
from ssd.sampling.params import SamplingParams
from ssd.tokenizer import Tokenizer, eos_token_ids, load_tokenizer

log = structlog.get_logger(__name__)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DataConfig:
    target: str  # target checkpoint folder
    seed: int = 0
    num_chat: int = 400  # template x topic instructions
    num_code_stubs: int = 176  # raw standard-library function stubs to complete
    num_code_chat: int = 208  # chat requests about standard-library functions
    num_docs: int = 80  # package documentation to summarize
    num_tasks: int = 320  # MT-Bench-like generated tasks (extraction, math, reasoning, role-play, writing, ...)
    max_prompt_tokens: int = 384  # longer prompts are cut (raw stubs) or skipped (chat)
    max_new_tokens: int = 256
    temperature: float = 0.0  # the target's answers: greedy by default, like the default serving mode
    top_k: int = 16  # target log-probs kept per position
    shard_size: int = 64  # prompts per shard (and per generation batch)
    max_shards: int | None = None  # use only the first shards (a prefix of the prompt list); None = all
    dtype: str = "auto"  # the target's: bfloat16 where the CPU runs it natively, else float32
    num_threads: int | None = None
    aux_layers: tuple[int, int, int] | None = None  # default: (2, L // 2, L - 3)

    def resolved_aux_layers(self) -> tuple[int, int, int]:
        num_layers = load_model_config(Path(self.target)).num_hidden_layers
        if self.aux_layers and max(self.aux_layers) >= num_layers:
            raise InvalidRequestError(f"aux layers {list(self.aux_layers)} must be below the target's "
                                      f"{num_layers} layers (layer i = the residual stream entering layer i)")
        return self.aux_layers or default_aux_layers(num_layers)


def _check_manifest(cache: Path, config: DataConfig) -> None:
    want = {**asdict(config), "aux_layers": list(config.resolved_aux_layers())}
    want.pop("num_threads")
    want.pop("max_shards")  # limits how many shards get made, never what a shard holds
    path = cache / MANIFEST
    if path.is_file():
        have = json.loads(path.read_text())
        if have != want:
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            raise InvalidRequestError(f"{cache} holds data built with other options ({', '.join(diff)}); "
                                      "use another --data-dir or delete it")
    else:
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(want, indent=2) + "\n")


def _encode(tokenizer: Tokenizer, prompt: TrainingPrompt, max_tokens: int) -> list[int] | None:
    if prompt.is_chat:
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}]))
        return ids if len(ids) <= max_tokens else None
    return tokenizer.encode(prompt.text)[-max_tokens:]


def save_shard(path: Path, captured: list[CapturedSequence]) -> int:
    """Store one shard atomically; returns its number of positions."""
    lengths = torch.tensor([len(c.tokens) for c in captured])
    tensors = {
        "tokens": torch.tensor([t for c in captured for t in c.tokens], dtype=torch.int32),  # [N]
        "features": torch.cat([c.features for c in captured]).to(torch.bfloat16),  # [N, 3*d]
        "topk_ids": torch.cat([c.topk_ids for c in captured]).to(torch.int32),  # [N, k] target ids
        "topk_logprobs": torch.cat([c.topk_logprobs for c in captured]).float(),  # [N, k]
        "seq_starts": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),  # [S + 1]
        "prompt_lens": torch.tensor([c.prompt_len for c in captured]),  # [S]
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.rename(path)
    return int(lengths.sum())


def generate_data(config: DataConfig, cache: Path) -> list[Path]:
    """Fill `cache` with every shard (skipping finished ones); returns the shard paths in order."""
    cache = Path(cache)
    _check_manifest(cache, config)
    prompts = build_training_prompts(config.seed, config.num_chat, config.num_code_stubs,
                                     config.num_code_chat, config.num_docs, config.num_tasks)
    shards = [prompts[i : i + config.shard_size] for i in range(0, len(prompts), config.shard_size)]
    shards = shards[: config.max_shards]
    paths = [cache / f"shard-{i:05d}.safetensors" for i in range(len(shards))]
    todo = [i for i, p in enumerate(paths) if not p.is_file()]
    log.info("draft data", prompts=len(prompts), shards=len(shards), to_generate=len(todo), cache=str(cache))
    if not todo:
        return [p for p in paths if p.is_file()]
    target = Path(config.target)
    tokenizer = load_tokenizer(target)
    if tokenizer is None:
        raise InvalidRequestError(f"{target} has no tokenizer; draft data needs text prompts")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    extractor = TargetFeatureExtractor(target, parse_dtype(config.dtype), config.resolved_aux_layers(),
                                       max_batch_tokens=2048)
    params = SamplingParams(temperature=config.temperature, max_tokens=config.max_new_tokens, seed=config.seed)
    eos = eos_token_ids(load_model_config(target).eos_token_ids, tokenizer)
    bar = tqdm(todo, desc="draft data (shards)", unit="shard")
    for i in bar:
        started = time.perf_counter()
        encoded = [ids for ids in (_encode(tokenizer, p, config.max_prompt_tokens) for p in shards[i]) if ids]
        captured = generate_captured(extractor, encoded, params, eos, config.top_k)
        num_tokens = save_shard(paths[i], captured)
        bar.set_postfix(tokens=num_tokens)
        log.info("shard written", shard=i, sequences=len(encoded), tokens=num_tokens,
                 answer_tokens=sum(len(c.tokens) - c.prompt_len for c in captured),
                 seconds=round(time.perf_counter() - started, 1))
    return [p for p in paths if p.is_file()]
