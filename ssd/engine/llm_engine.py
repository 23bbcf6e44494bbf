"""The engine loop: admit requests, schedule a batch, run the model, sample, commit, finish.

One `step()` is one forward. The engine is single-threaded; services run it in a thread of its own.
"""

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from ssd.config import EngineConfig
from ssd.engine.model_runner import ForwardItem, ModelRunner
from ssd.engine.scheduler import ScheduledBatch, Scheduler
from ssd.engine.sequence import FinishReason, Sequence
from ssd.errors import InvalidRequestError, ResourceExhaustedError
from ssd.kv.block_manager import BlockManager
from ssd.kv.kv_cache import KVCacheShape, allocate_kv_cache
from ssd.layers.linear import pack_linear_weights
from ssd.loader.model_loader import load_model, parse_dtype
from ssd.model_store import resolve_model
from ssd.sampling.params import SamplingParams
from ssd.sampling.sampler import sample_tokens
from ssd.tokenizer import load_tokenizer

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class EngineInfo:
    """Values derived at start-up (never written back into the config)."""

    model_path: Path
    num_kv_blocks: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    vocab_size: int


@dataclass(frozen=True)
class StepOutput:
    seq_id: int
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    num_cached_prompt_tokens: int  # prompt tokens the prefix cache served at admission


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        path = resolve_model(config.model)
        self.dtype = parse_dtype(config.dtype)
        self.device = torch.device("cpu")
        started = time.perf_counter()
        self.model, self.model_config = load_model(path, self.dtype)
        if config.linear_backend == "onednn":
            pack_linear_weights(self.model)
        self.tokenizer = load_tokenizer(path)
        mc = self.model_config
        shape = KVCacheShape(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, config.block_size, self.dtype)
        num_blocks = shape.num_blocks_for(config.kv_cache_memory_mb * 2**20)
        self.kv_cache = allocate_kv_cache(self.model, shape, num_blocks, self.device)
        eos = set(mc.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        max_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        self.info = EngineInfo(path, num_blocks, max_len, frozenset(eos), mc.vocab_size)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, max(config.max_num_batched_tokens, max_len))
        self.runner = ModelRunner(self.model, config.block_size, self.device)
        self.seqs: dict[int, Sequence] = {}
        self._ids = itertools.count()
        self._seed_source = torch.Generator().manual_seed(config.seed)
        log.info("engine ready", model=str(path), dtype=config.dtype, kv_blocks=num_blocks,
                 max_model_len=max_len, load_s=round(time.perf_counter() - started, 2))

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Validate and queue a request; returns its sequence id."""
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if any(not 0 <= t < self.info.vocab_size for t in prompt_token_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.info.vocab_size})")
        if len(prompt_token_ids) >= self.info.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; max_model_len is {self.info.max_model_len}"
            )
        needed = min(len(prompt_token_ids) + params.max_tokens, self.info.max_model_len)
        if self.block_manager.blocks_for(needed) > self.block_manager.num_blocks:
            raise ResourceExhaustedError(
                f"the request needs {needed} tokens of KV; the cache holds {self.block_manager.num_blocks} blocks"
            )
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_source))
        seq = Sequence(next(self._ids), list(prompt_token_ids), len(prompt_token_ids), params,
                       torch.Generator().manual_seed(seed))
        self.seqs[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq.seq_id

    def abort(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, FinishReason.ABORT)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        items = [
            ForwardItem(seq.token_ids[seq.num_cached_tokens :], seq.num_cached_tokens, seq.block_table)
            for seq in batch.seqs
        ]
        logits = self.runner.forward(items, batch.mode).logits  # [B, V]
        tokens = sample_tokens(logits, [s.params for s in batch.seqs], [s.generator for s in batch.seqs])
        return self._commit(batch, tokens)

    def _commit(self, batch: ScheduledBatch, tokens: list[int]) -> list[StepOutput]:
        outputs = []
        now = time.perf_counter()
        for seq, token in zip(batch.seqs, tokens, strict=True):
            seq.num_cached_tokens = seq.num_tokens  # KV now covers every token fed so far
            self.block_manager.commit(seq)
            seq.token_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = self.finish_reason(seq, [token])
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self.seqs.pop(seq.seq_id, None)
            outputs.append(StepOutput(seq.seq_id, [token], reason, seq.num_prefix_cached_tokens))
        return outputs

    def finish_reason(self, seq: Sequence, new_tokens: list[int]) -> FinishReason | None:
        p = seq.params
        if any(t in p.stop_token_ids or (not p.ignore_eos and t in self.info.eos_token_ids) for t in new_tokens):
            return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.info.max_model_len:
            return FinishReason.LENGTH
        return None
