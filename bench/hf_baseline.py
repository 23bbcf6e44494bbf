"""HF transformers `generate` on the same checkpoint, dtype and threads: the baseline a CPU user reaches for."""

import copy
import time
from pathlib import Path

import torch

from bench.timing import GroupTiming

STATIC_CACHE_LEN = 1024  # the compiled baseline's KV cache length (a multiple of it where a prompt needs more)


class _FirstTokenClock:
    """A generate() streamer that records when the first new token arrives (the first put is the prompt)."""

    def __init__(self) -> None:
        self.num_puts = 0
        self.first_token_time: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.num_puts += 1
        if self.num_puts == 2:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


class HFGenerator:
    """HF `generate`; with `assistant` it is HF assisted generation (a draft checkpoint, or "ngram" for
    HF's prompt lookup), the peer baseline for a draft-model proposer; `compiled`: with a static KV cache and the
    model's forward under torch.compile (the first calls compile: the bench's warm-up prompts take the decode graph,
    and prefill shapes turn dynamic after their second length)."""

    def __init__(self, path: Path, dtype: str, assistant: str | None = None, num_assistant_tokens: int = 4,
                 compiled: bool = False) -> None:
        from transformers import AutoModelForCausalLM

        from ssd.model_store import resolve_model

        torch_dtype = getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype).eval()
        self.assistant = None
        self.extra: dict = {}
        if assistant == "ngram":
            self.extra = {"prompt_lookup_num_tokens": num_assistant_tokens}
        elif assistant is not None:
            self.assistant = AutoModelForCausalLM.from_pretrained(str(resolve_model(assistant)), dtype=torch_dtype).eval()
            self.assistant.generation_config.num_assistant_tokens = num_assistant_tokens
            self.assistant.generation_config.num_assistant_tokens_schedule = "constant"
            self.extra = {"assistant_model": self.assistant}
        # like the engine's ignore_eos: EOS may be generated but does not stop generation
        # (HF's min_new_tokens would instead forbid EOS and change the tokens)
        self.config = copy.deepcopy(self.model.generation_config)
        self.config.eos_token_id = None
        self.compiled = compiled
        if compiled:  # HF's recipe for a fast generate: a static KV cache and the forward under torch.compile
            self.model.forward = torch.compile(self.model.forward, fullgraph=True)

    @torch.inference_mode()
    def generate(self, group: list[list[int]], output_len: int, temperature: float) -> GroupTiming:
        width = max(len(ids) for ids in group)
        pad = 0
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in group])  # left padding
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group])
        config = copy.deepcopy(self.config)
        config.max_new_tokens = output_len
        config.do_sample = temperature > 0
        config.temperature = temperature if temperature > 0 else None
        config.top_p, config.top_k, config.pad_token_id = None, None, pad
        extra = dict(self.extra)
        if self.compiled:  # one cache length for every prompt, so the decode graph compiles once per batch size
            from transformers import StaticCache

            length = -(-(width + output_len) // STATIC_CACHE_LEN) * STATIC_CACHE_LEN
            extra["past_key_values"] = StaticCache(self.model.config, max_cache_len=length)
        clock = _FirstTokenClock()
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=input_ids, attention_mask=mask, generation_config=config,
            streamer=clock if len(group) == 1 else None, **extra,
        )
        total = time.perf_counter() - start
        first = (clock.first_token_time - start) if clock.first_token_time else 0.0
        tokens = [row[width:].tolist() for row in out]
        return GroupTiming(tokens, first, total)
