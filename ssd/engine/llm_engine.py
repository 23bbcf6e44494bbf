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
from ssd.context import ForwardMode
from ssd.device import resolve_device
from ssd.dtypes import dtype_name
from ssd.engine.mode_choice import CHOICES, PLAIN, SD, SPECULATE, SPECULATE_OR_PLAIN, ModeChooser
from ssd.engine.scheduler import ScheduledBatch, Scheduler
from ssd.engine.sequence import FinishReason, Sequence
from ssd.engine.speculative_decoder import SpeculativeDecoder
from ssd.errors import InvalidRequestError, ResourceExhaustedError
from ssd.layers.quantized_linear import int4_kernels
from ssd.model_config import load_model_config
from ssd.model_store import resolve_model
from ssd.runtime.model_runner import ForwardItem
from ssd.runtime.model_worker import ModelWorker
from ssd.runtime.tensor_parallel import TensorParallelWorkers, start_tensor_parallel
from ssd.sampling.grammar import GrammarCompiler, GrammarState
from ssd.sampling.logit_adjust import adjust_logits, has_adjustments
from ssd.sampling.logprobs import TokenLogprob, prompt_token_logprobs, token_logprobs
from ssd.sampling.params import SamplingParams
from ssd.sampling.sampler import sample_tokens
from ssd.speculation.factory import build_proposer
from ssd.speculation.proposer import Proposer
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.speculation_stats import SpecStats
from ssd.tokenizer import eos_token_ids, load_tokenizer

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
    spec: SpecStats | None = None  # the request's speculation statistics, on its last step
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked (params.logprobs)
    prompt_logprobs: list[TokenLogprob] | None = None  # first output only: prompt tokens 1.. (params.prompt_logprobs)


class LLMEngine:
    """`proposer` replaces the one `config.speculation` would build (e.g. a remote draft service)."""

    def __init__(self, config: EngineConfig, proposer: Proposer | None = None) -> None:
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)  # before any loading: a missing GPU fails at once
        path = resolve_model(config.model)
        self.tp_workers: TensorParallelWorkers | None = None
        if config.tensor_parallel_size > 1:
            self.worker, self.tp_workers = start_tensor_parallel(path, load_model_config(path), config)
        else:
            self.worker = ModelWorker.for_engine(path, config, self.device)
        self.model, self.model_config = self.worker.model, self.worker.model_config
        self.block_manager, self.runner = self.worker.block_manager, self.worker.runner
        self.tokenizer = load_tokenizer(path)
        mc = self.model_config
        eos = eos_token_ids(mc.eos_token_ids, self.tokenizer)
        max_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        self.info = EngineInfo(path, self.worker.num_blocks, max_len, eos, mc.vocab_size)
        tokenizer_json = path / "tokenizer.json"
        self.grammars = GrammarCompiler(tokenizer_json, mc.vocab_size, eos) if tokenizer_json.is_file() else None
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, max(config.max_num_batched_tokens, max_len),
                                   config.prefill_chunk_tokens)
        self.speculative_decoder: SpeculativeDecoder | None = None
        if proposer is not None and config.speculation is None:
            raise InvalidRequestError("a proposer was given but speculation is not configured")
        if config.speculation is not None:
            proposer = proposer or build_proposer(config.speculation, self.worker, dtype_name(self.worker.dtype))
            self.speculative_decoder = SpeculativeDecoder(config.speculation, proposer, self.runner, self.block_manager)
        self.mode_chooser = ModeChooser()  # for requests whose mode is adaptive
        self.seqs: dict[int, Sequence] = {}
        self._ids = itertools.count()
        self._seed_source = torch.Generator().manual_seed(config.seed)
        log.info("engine ready", model=str(path), dtype=dtype_name(self.worker.dtype), device=str(self.device),
                 kv_blocks=self.worker.num_blocks, max_model_len=max_len, load_s=round(self.worker.load_s, 2),
                 tensor_parallel_size=config.tensor_parallel_size, quantization=self.worker.quantization.describe(),
                 int4_kernels=int4_kernels(self.worker.model))

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (they also stop when this process exits)."""
        if self.tp_workers is not None:
            self.tp_workers.close()

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Validate and queue a request; returns its sequence id."""
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if any(not 0 <= t < self.info.vocab_size for t in prompt_token_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.info.vocab_size})")
        if any(not 0 <= t < self.info.vocab_size for t, _ in params.logit_bias):
            raise InvalidRequestError(f"logit_bias token ids must be in [0, {self.info.vocab_size})")
        if len(prompt_token_ids) >= self.info.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; max_model_len is {self.info.max_model_len}"
            )
        needed = min(len(prompt_token_ids) + params.max_tokens, self.info.max_model_len)
        if self.block_manager.blocks_for(needed) > self.block_manager.num_blocks:
            raise ResourceExhaustedError(
                f"the request needs {needed} tokens of KV; the cache holds {self.block_manager.num_blocks} blocks"
            )
        grammar = self._compile_grammar(params)
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seed_source))
        ending = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.info.eos_token_ids)
        seq = Sequence(next(self._ids), list(prompt_token_ids), len(prompt_token_ids), params,
                       torch.Generator().manual_seed(seed), ending_ids=ending,  # generator on CPU: sampling runs there
                       grammar=grammar)
        self.seqs[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq.seq_id

    def _compile_grammar(self, params: SamplingParams) -> GrammarState | None:
        if params.grammar is None:
            return None
        if self.grammars is None:
            raise InvalidRequestError(f"structured output needs the model's tokenizer.json ({self.info.model_path})")
        return self.grammars.compile(params.grammar)

    def abort(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is not None and not seq.is_finished:
            self._finish(seq, FinishReason.ABORT)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.scheduler.finish(seq, reason)
        if self.speculative_decoder is not None:
            self.speculative_decoder.release(seq.seq_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """One forward: a prefill batch, a decode batch, or a speculative round for the decode batch."""
        reserve = self.speculative_decoder.lookahead_slots if self.speculative_decoder is not None else 0
        batch = self.scheduler.schedule(num_lookahead_tokens=reserve)
        if batch is None:
            return []
        decoder = self.speculative_decoder
        k = decoder.config.lookahead_for(len(batch.seqs)) if decoder is not None else 0
        adaptive = batch.mode == ForwardMode.DECODE and k > 0 and any(s.params.adaptive for s in batch.seqs)
        options = self._options(batch.seqs) if adaptive else SPECULATE_OR_PLAIN
        unseen = 0  # tokens the adaptive sequences' drafts have not seen (what a switch to speculating catches up)
        if adaptive:
            unseen = sum(max(0, s.num_tokens - s.num_draft_seen) for s in batch.seqs if s.params.adaptive)
        # a draft still prefilling new prompts beside the target: plain steps, which the chooser records unmeasured
        # (the draft's prefill on the next core slows them)
        waiting = adaptive and decoder.catching_up
        choice = SPECULATE
        if waiting:
            choice = self.mode_chooser.wait_for_draft()
        elif adaptive:
            choice = self.mode_chooser.choose(len(batch.seqs), options, k, unseen, [s.seq_id for s in batch.seqs])
        started = time.perf_counter()
        if batch.mode == ForwardMode.DECODE and k > 0 and self._speculates(batch.seqs, choice):
            outcomes, new_logprobs = self._speculative_round(batch.seqs, k, choice)
        else:
            decoding = batch.mode == ForwardMode.DECODE and decoder is not None  # only a speculating engine chooses
            fed = sum(batch.num_new_tokens)
            batch, items, logits = self._forward(batch)  # the sequences whose prompt (or next token) is fully fed
            if batch.mode == ForwardMode.PREFILL and decoder is not None:  # bounds a draft's catch-up per token
                self.mode_chooser.forward_cost.record_prefill(fed, time.perf_counter() - started)
            if not batch.seqs:
                return []
            tokens, new_logprobs = self._sample(batch, items, logits)
            if decoding and not waiting:  # what a decode-shaped forward costs, for the chooser's predictions
                self.mode_chooser.forward_cost.record(len(batch.seqs), time.perf_counter() - started)
            outcomes = [RoundOutcome.plain(s.seq_id, s.num_tokens, [t]) for s, t in zip(batch.seqs, tokens,
                                                                                        strict=True)]
        if adaptive:
            self.mode_chooser.record(len(batch.seqs), choice, time.perf_counter() - started,
                                     sum(len(o.new_tokens) for o in outcomes), options, unseen, measured=not waiting)
            for seq in batch.seqs:
                seq.spec_counters.num_plain_steps += seq.params.adaptive and choice == PLAIN
                seq.spec_counters.num_sd_rounds += seq.params.adaptive and choice == SD and decoder.overlaps(seq)
        outputs = self._commit(batch, outcomes, new_logprobs)
        if adaptive and choice == PLAIN:  # the drafts of the sequences held back keep up beside the target
            decoder.catch_up([s for s in batch.seqs if s.params.adaptive and s.params.is_speculative
                              and not s.is_finished])
        elif batch.mode == ForwardMode.PREFILL and decoder is not None:  # drafts prefill beside the first steps
            decoder.catch_up([s for s in batch.seqs if s.params.is_speculative and not s.is_finished])
        return outputs

    def _speculative_round(self, seqs: list[Sequence], k: int,
                           choice: str) -> tuple[list[RoundOutcome], list[list[TokenLogprob] | None]]:
        """A speculative round under the chooser's `choice` for the adaptive sequences (plain steps, or SD rounds
        for SSD ones); its verify forward's cost goes to the chooser's forward-cost model."""
        decoder = self.speculative_decoder
        held = frozenset(s.seq_id for s in seqs if s.params.adaptive) if choice != SPECULATE else frozenset()
        for seq in seqs:
            if seq.params.is_speculative and (choice != PLAIN or not seq.params.adaptive):
                seq.num_draft_seen = seq.num_tokens  # its draft catches up on everything before this round
        counters = decoder.counters
        verify_s, drafted = counters.verify_s, counters.num_draft_tokens
        out = decoder.run_round(seqs, k, plain=held if choice == PLAIN else frozenset(),
                                sd_round=held if choice == SD else frozenset())
        self.mode_chooser.forward_cost.record(len(seqs) + counters.num_draft_tokens - drafted,
                                              counters.verify_s - verify_s)  # root + draft tokens of each sequence
        return out

    @staticmethod
    def _speculates(seqs: list[Sequence], choice: str) -> bool:
        """Whether a decode batch takes a speculative round: some sequence speculates under `choice`."""
        return any(s.params.is_speculative and (choice != PLAIN or not s.params.adaptive) for s in seqs)

    def _options(self, seqs: list[Sequence]) -> tuple[str, ...]:
        """The mode chooser's options for a decode batch: SD too where an adaptive sequence runs SSD."""
        decoder = self.speculative_decoder
        if decoder is not None and any(s.params.adaptive and decoder.overlaps(s) for s in seqs):
            return CHOICES
        return SPECULATE_OR_PLAIN

    def _forward(self, batch: ScheduledBatch) -> tuple[ScheduledBatch, list[ForwardItem], torch.Tensor]:
        """Feed each sequence its scheduled tokens. A prompt chunk that leaves more of the prompt to feed only
        fills KV; the other sequences come back to be sampled, with their items and logits [sum(num_logits), V]."""
        done = [seq.num_cached_tokens + n == seq.num_tokens for seq, n in zip(batch.seqs, batch.num_new_tokens,
                                                                                  strict=True)]
        items = [
            ForwardItem(seq.token_ids[seq.num_cached_tokens : seq.num_cached_tokens + n], seq.num_cached_tokens,
                        seq.block_table, num_logits=(n if seq.needs_prompt_logprobs else 1) if last else 0)
            for seq, n, last in zip(batch.seqs, batch.num_new_tokens, done, strict=True)
        ]
        aux_layers = self.speculative_decoder.feature_layers if self.speculative_decoder is not None else ()
        out = self.runner.forward(items, batch.mode, aux_layers)  # logits [sum(num_logits), V]
        if out.aux_hidden is not None:  # the proposer learns every new position's target features
            rows = out.aux_hidden.split([len(it.token_ids) for it in items])
            for seq, item, seq_rows in zip(batch.seqs, items, rows, strict=True):
                self.speculative_decoder.add_features(seq, item.start_position, seq_rows)
        for seq, n, last in zip(batch.seqs, batch.num_new_tokens, done, strict=True):
            if not last:  # a chunk of a longer prompt: its KV is in, nothing to sample yet
                seq.num_cached_tokens += n
                self.block_manager.commit(seq)
        fed = [it for it, last in zip(items, done, strict=True) if last]
        seqs = [seq for seq, last in zip(batch.seqs, done, strict=True) if last]
        return ScheduledBatch(batch.mode, seqs, [len(it.token_ids) for it in fed]), fed, out.logits

    def _sample(self, batch: ScheduledBatch, items: list[ForwardItem],
                logits: torch.Tensor) -> tuple[list[int], list[list[TokenLogprob] | None]]:
        """Each sequence's next token from its logits (one row each, unless it scores its prompt), plus its
        logprob where the request asked."""
        if any(seq.needs_prompt_logprobs for seq in batch.seqs):
            logits = self._score_prompts(batch.seqs, items, logits)
        raw = logits
        if any(has_adjustments(s.params) for s in batch.seqs):
            logits = torch.cat([adjust_logits(logits[b : b + 1], s.output_token_ids, [[]], s.params,
                                              s.prompt_token_ids, s.ending_ids, s.grammar)
                                for b, s in enumerate(batch.seqs)])
        tokens = sample_tokens(logits, [s.params for s in batch.seqs], [s.generator for s in batch.seqs])
        logprobs = [None if s.params.logprobs is None else token_logprobs(raw[b : b + 1], [t], s.params.logprobs)
                    for b, (s, t) in enumerate(zip(batch.seqs, tokens, strict=True))]
        return tokens, logprobs

    @staticmethod
    def _score_prompts(seqs: list[Sequence], items: list[ForwardItem], logits: torch.Tensor) -> torch.Tensor:
        """logits [sum(num_logits), V] -> each item's last row [B, V]; the sequences that asked keep their prompt
        logprobs (their prefill starts at position 0, so row i scores prompt token i + 1)."""
        per_item = logits.split([it.num_logits for it in items])
        for seq, rows in zip(seqs, per_item, strict=True):
            if seq.needs_prompt_logprobs:
                seq.prompt_logprobs = prompt_token_logprobs(rows[:-1], seq.token_ids[1:], seq.params.prompt_logprobs)
        return torch.stack([rows[-1] for rows in per_item])

    def _commit(self, batch: ScheduledBatch, outcomes: list[RoundOutcome],
                new_logprobs: list[list[TokenLogprob] | None]) -> list[StepOutput]:
        outputs = []
        now = time.perf_counter()
        for seq, outcome, logprobs in zip(batch.seqs, outcomes, new_logprobs, strict=True):
            seq.num_cached_tokens = seq.num_tokens + len(outcome.new_tokens) - 1  # KV covers all but the newest token
            emitted, reason = [], None
            for token in outcome.new_tokens:  # stop at the first token that finishes the request
                seq.token_ids.append(token)
                emitted.append(token)
                reason = self.finish_reason(seq, [token])
                if reason is not None:
                    break
            seq.num_cached_tokens = min(seq.num_cached_tokens, seq.num_tokens - 1)
            self.block_manager.commit(seq)
            prompt_logprobs = seq.prompt_logprobs if seq.first_token_time is None else None
            if seq.first_token_time is None:
                seq.first_token_time = now
            spec = None
            if reason is not None:
                self._finish(seq, reason)
                self.seqs.pop(seq.seq_id, None)
                counted = seq.spec_counters.num_drafts or seq.spec_counters.num_plain_steps
                spec = seq.spec_counters if counted else None  # finished: no more counting
            elif self.speculative_decoder is not None:  # not truncated: a truncated round finished the sequence
                self.speculative_decoder.proposer.observe(seq.seq_id, outcome)
            outputs.append(StepOutput(seq.seq_id, emitted, reason, seq.num_prefix_cached_tokens, spec,
                                      None if logprobs is None else logprobs[: len(emitted)], prompt_logprobs))
        return outputs

    def finish_reason(self, seq: Sequence, new_tokens: list[int]) -> FinishReason | None:
        if any(t in seq.ending_ids for t in new_tokens):
            return FinishReason.STOP
        if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.info.max_model_len:
            return FinishReason.LENGTH
        return None
