"""Continuous batching: requests join and leave between steps; FIFO admission; chunked prefill; preemption.

Each step is either a prefill batch (newly admitted or preempted sequences, and prompts part-way in) or a
decode batch (every running sequence whose prompt is in). A prompt longer than a prefill's token budget is fed
in chunks over several steps: the budget is `prefill_chunk_tokens` while other sequences are decoding, and
those sequences step between two chunks, so a long prompt delays their next token by one chunk's forward,
not the whole prompt's; with nobody decoding the budget is `max_num_batched_tokens`. When KV blocks run out
the most recently admitted sequence is preempted: its blocks are freed, and it returns to the head of the
queue keeping every token it generated (they are recomputed on re-admission and still count against
`max_tokens`).
"""

from collections import deque
from dataclasses import dataclass

import structlog

from ssd.context import ForwardMode
from ssd.engine.sequence import FinishReason, Sequence, SequenceStatus
from ssd.kv.block_manager import BlockManager

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ScheduledBatch:
    mode: ForwardMode  # PREFILL or DECODE
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens each sequence feeds in this forward


def is_prefilling(seq: Sequence) -> bool:
    """Admitted, with prompt tokens still to feed (a decoding sequence lacks only its newest token's KV)."""
    return seq.num_cached_tokens < seq.num_tokens - 1


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 prefill_chunk_tokens: int = 0) -> None:
        """`prefill_chunk_tokens`: a prefill's token budget while sequences are decoding (0 = no chunking then:
        whole prompts go first, as they come)."""
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # prefix cache lookups at first admission, in tokens (vLLM's prefix_cache_queries / prefix_cache_hits)
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        self._last_was_chunk = False  # the last step fed a prompt chunk while others were decoding

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, num_lookahead_tokens: int = 0) -> ScheduledBatch | None:
        """The next batch; decode reserves room for `num_lookahead_tokens` extra tokens per sequence."""
        decoding = any(not is_prefilling(s) for s in self.running)
        if decoding and self._last_was_chunk:  # the decoding sequences step between two chunks
            self._last_was_chunk = False
            batch = self._schedule_decode(num_lookahead_tokens)
            if batch is not None:
                return batch
        chunked = decoding and self.prefill_chunk_tokens > 0
        batch = self._schedule_prefill(self.prefill_chunk_tokens if chunked else self.max_num_batched_tokens)
        if batch is not None:
            self._last_was_chunk = chunked
            return batch
        return self._schedule_decode(num_lookahead_tokens)

    def _schedule_prefill(self, budget: int) -> ScheduledBatch | None:
        """Prompts part-way in first (they hold blocks), then admissions in FIFO order, within `budget` tokens."""
        seqs: list[Sequence] = []
        counts: list[int] = []
        for seq in self.running:
            if is_prefilling(seq) and budget > 0:
                n = _chunk(seq, budget, first=not seqs)
                if n:
                    seqs.append(seq)
                    counts.append(n)
                    budget -= n
        while self.waiting and len(self.running) < self.max_num_seqs and budget >= 2:
            seq = self.waiting[0]
            if seqs and seq.needs_prompt_logprobs and seq.num_tokens > budget:
                break  # a scored prompt goes whole: next step, first
            if not self.block_manager.can_allocate(seq):
                break  # FIFO: nobody overtakes the head of the queue
            first_admission = seq.num_preemptions == 0
            self.block_manager.allocate(seq, reuse_prefix=not seq.needs_prompt_logprobs)
            n = _chunk(seq, budget, first=not seqs)  # >= 1: the budget is >= 2
            self.waiting.popleft()
            if first_admission:
                seq.num_prefix_cached_tokens = seq.num_cached_tokens
                if self.block_manager.enable_prefix_caching and not seq.needs_prompt_logprobs:
                    self.num_prefix_queried_tokens += seq.num_tokens
                    self.num_prefix_hit_tokens += seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        if not seqs:
            return None
        partial = [(s.seq_id, n) for s, n in zip(seqs, counts, strict=True) if s.num_cached_tokens + n < s.num_tokens]
        if partial:
            log.debug("prefill chunks", chunks=partial)
        return ScheduledBatch(ForwardMode.PREFILL, seqs, counts)

    def _schedule_decode(self, num_lookahead_tokens: int) -> ScheduledBatch | None:
        seqs: list[Sequence] = []
        for seq in list(self.running):
            if seq.status != SequenceStatus.RUNNING or is_prefilling(seq):
                continue  # preempted earlier in this loop, or its prompt is not in yet
            needed = seq.num_tokens + num_lookahead_tokens
            while not self.block_manager.can_grow(seq, needed):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status == SequenceStatus.RUNNING:
                self.block_manager.ensure_capacity(seq, needed)
                seqs.append(seq)
        if not seqs:
            return None
        return ScheduledBatch(ForwardMode.DECODE, seqs, [1] * len(seqs))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        log.debug("preempted", seq_id=seq.seq_id, num_tokens=seq.num_tokens)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Mark finished and release its blocks (from the queue or the running set)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason


def _chunk(seq: Sequence, budget: int, first: bool) -> int:
    """Tokens `seq` feeds this step: the rest of its prompt, or as much as `budget` allows (0 = none now).

    A chunk never leaves exactly one token (the sequence would look like it is decoding). A sequence that
    scores its prompt goes whole (its logprobs come from one forward): alone if it exceeds the budget."""
    remaining = seq.num_tokens - seq.num_cached_tokens
    if remaining <= budget:
        return remaining
    if seq.needs_prompt_logprobs:
        return remaining if first else 0
    n = min(budget, remaining - 2)  # remaining >= 2 here: budget >= 1
    return max(n, 0)
