"""Back-pressure at the target: a bounded queue of admitted requests, checked on the engine thread at add time.

Past `max_num_seqs` running plus `max_waiting_seqs` waiting sequences, or past `max_queued_tokens` prompt
tokens waiting, a new request is refused with ResourceExhaustedError (RESOURCE_EXHAUSTED): the caller (the
gateway) can send it to another replica or answer 429, instead of the queue growing without bound.
"""

from dataclasses import dataclass

from ssd.engine.llm_engine import LLMEngine
from ssd.errors import ResourceExhaustedError


@dataclass(frozen=True)
class AdmissionLimits:
    max_seqs: int  # running + waiting sequences at most (max_num_seqs + max_waiting_seqs)
    max_queued_tokens: int  # prompt tokens of the waiting sequences at most


def check_admission(engine: LLMEngine, num_prompt_tokens: int, limits: AdmissionLimits) -> None:
    """Raise ResourceExhaustedError when one more request of `num_prompt_tokens` would pass the limits."""
    if len(engine.seqs) >= limits.max_seqs:
        raise ResourceExhaustedError(f"the target is full: {len(engine.seqs)} requests admitted "
                                     f"(at most {limits.max_seqs}); retry later or on another replica")
    queued = sum(seq.num_prompt_tokens for seq in engine.scheduler.waiting)
    if queued and queued + num_prompt_tokens > limits.max_queued_tokens:
        raise ResourceExhaustedError(f"the target's queue is full: {queued} prompt tokens waiting "
                                     f"(at most {limits.max_queued_tokens}); retry later or on another replica")
