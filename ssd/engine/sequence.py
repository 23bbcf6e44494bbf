"""One request's state inside the engine: its tokens, KV blocks, sampling state and timings."""

import time
from dataclasses import dataclass, field
from enum import Enum, StrEnum

import torch

from ssd.sampling.grammar import GrammarState
from ssd.sampling.logprobs import TokenLogprob
from ssd.sampling.params import SamplingParams
from ssd.speculation.feature_log import FeatureLog
from ssd.speculation.speculation_stats import SpecStats


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"  # EOS or a stop token
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # cancelled by the caller


@dataclass
class Sequence:
    seq_id: int
    token_ids: list[int]  # prompt then generated tokens; preemption never folds one into the other
    num_prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # leading tokens whose KV is computed and committed
    num_hashed_blocks: int = 0  # leading blocks registered in the prefix cache
    num_prefix_cached_tokens: int = 0  # tokens reused from the prefix cache at first admission
    num_draft_seen: int = 0  # tokens at its last speculative round: what its draft has seen (mode auto)
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    spec_counters: SpecStats = field(default_factory=SpecStats)  # this request's speculation
    prompt_logprobs: list[TokenLogprob] | None = None  # set at the first prefill when params.prompt_logprobs asks
    ending_ids: frozenset[int] = frozenset()  # tokens that finish it: the stop ids, and EOS unless ignore_eos
    grammar: GrammarState | None = None  # params.grammar compiled (structured output)
    features: FeatureLog = field(default_factory=FeatureLog)  # EAGLE-3 target features on their way to the proposer

    @property
    def needs_prompt_logprobs(self) -> bool:
        """The next prefill must score every prompt token (so it may not start from cached prefix blocks)."""
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
