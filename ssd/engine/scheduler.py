"""Continuous batching: requests join and leave between steps; FIFO admission; preemption.

Each step is either a prefill batch (newly admitted or preempted sequences) or a decode batch
(every running sequence). When KV blocks run out the most recently admitted sequence is
preempted: its blocks are freed, and it returns to the head of the queue keeping every token it
generated (they are recomputed on re-admission and still count against `max_tokens`).
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


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, num_lookahead_tokens: int = 0) -> ScheduledBatch | None:
        """The next batch; decode reserves room for `num_lookahead_tokens` extra tokens per sequence."""
        return self._schedule_prefill() or self._schedule_decode(num_lookahead_tokens)

    def _schedule_prefill(self) -> ScheduledBatch | None:
        seqs: list[Sequence] = []
        counts: list[int] = []
        budget = self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if (seqs and seq.num_tokens > budget) or not self.block_manager.can_allocate(seq):
                break  # FIFO: nobody overtakes the head of the queue
            self.waiting.popleft()
            first_admission = seq.num_preemptions == 0
            self.block_manager.allocate(seq, reuse_prefix=not seq.needs_prompt_logprobs)
            if first_admission:
                seq.num_prefix_cached_tokens = seq.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            seqs.append(seq)
            counts.append(seq.num_tokens - seq.num_cached_tokens)
            budget -= counts[-1]
        return ScheduledBatch(ForwardMode.PREFILL, seqs, counts) if seqs else None

    def _schedule_decode(self, num_lookahead_tokens: int) -> ScheduledBatch | None:
        seqs: list[Sequence] = []
        for seq in list(self.running):
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
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
