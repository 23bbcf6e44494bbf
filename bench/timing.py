"""What one timed group of prompts produced."""

from dataclasses import dataclass


@dataclass
class GroupTiming:
    token_ids: list[list[int]]  # generated tokens per prompt
    prefill_s: float  # start to the last sequence's first token
    total_s: float  # start to the last token
