"""Driving an engine step by step in tests, collecting each sequence's new tokens."""

from ssd.engine.llm_engine import LLMEngine


def run_steps(engine: LLMEngine, tokens: dict[int, list[int]], steps: int | None = None) -> None:
    """Take `steps` engine steps (None: until no request is left), appending each output's new tokens to
    tokens[seq_id]."""
    taken = 0
    while (taken < steps) if steps is not None else engine.has_unfinished():
        for out in engine.step():
            tokens[out.seq_id].extend(out.new_token_ids)
        taken += 1
