"""The offline Python API: `LLM(model).generate(prompts, params)` and its streaming form."""

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from ssd.config import EngineConfig
from ssd.engine.llm_engine import LLMEngine
from ssd.engine.sequence import FinishReason
from ssd.errors import InvalidRequestError
from ssd.model_store import DEFAULT_MODEL
from ssd.sampling.logprobs import TokenLogprob
from ssd.sampling.params import SamplingParams
from ssd.speculation.proposer import Proposer
from ssd.speculation.speculation_stats import SpecStats
from ssd.tokenizer import IncrementalDetokenizer, Tokenizer

Prompt = str | list[int]


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    num_cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    ttft_s: float | None = None  # time to first token
    latency_s: float | None = None  # time to the last token
    spec: SpecStats | None = None  # speculation statistics (drafts, accepted, tokens per round), when speculating
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt token after the first (params.prompt_logprobs)


@dataclass(frozen=True)
class StreamDelta:
    token_ids: list[int]  # tokens new since the previous delta
    text: str  # text new since the previous delta (never a broken UTF-8 character)
    finish_reason: FinishReason | None
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob] | None = None  # first delta only, when params.prompt_logprobs is set


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, proposer: Proposer | None = None, **engine_options: Any) -> None:
        """`engine_options`: EngineConfig's fields (dtype, device, speculation, ...). `proposer` replaces
        the one the speculation config would build (e.g. a remote draft service)."""
        self.engine = LLMEngine(EngineConfig(model=model, **engine_options), proposer)
        self.tokenizer = self.engine.tokenizer

    def close(self) -> None:
        """Stop the tensor-parallel worker processes, if any (they also stop when this process exits)."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise InvalidRequestError("this checkpoint has no tokenizer; pass prompts as token ids")
        return self.tokenizer

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        return self._require_tokenizer().apply_chat_template(messages)

    def chat(
        self,
        messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or several (batched together),
        through the model's chat template."""
        if not messages:
            raise InvalidRequestError("no messages")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        return self.generate([self.chat_prompt(list(c)) for c in conversations], params, use_tqdm)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids) if self.tokenizer is not None else ""

    def _encode(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty")
            return prompt, self._require_tokenizer().encode(prompt)
        if not all(isinstance(t, int) for t in prompt):
            raise InvalidRequestError("a prompt is a string or a list of token ids")
        return None, list(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (all batched together); outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        encoded = [self._encode(p) for p in prompts]  # validate all before queueing any
        outputs: dict[int, RequestOutput] = {}
        order = []
        for (text, ids), p in zip(encoded, params_list, strict=True):
            seq_id = self.engine.add_request(ids, p)
            outputs[seq_id] = RequestOutput(seq_id, text, ids)
            order.append(seq_id)
        start = time.perf_counter()
        bar = tqdm(total=len(order), desc="generate", disable=not use_tqdm)
        while self.engine.has_unfinished():
            for step in self.engine.step():
                out = outputs[step.seq_id]
                if out.ttft_s is None:
                    out.ttft_s = time.perf_counter() - start
                    out.num_cached_prompt_tokens = step.num_cached_prompt_tokens
                    out.prompt_logprobs = step.prompt_logprobs
                out.token_ids.extend(step.new_token_ids)
                if step.logprobs is not None:
                    out.logprobs = out.logprobs if out.logprobs is not None else []
                    out.logprobs.extend(step.logprobs)
                if step.finish_reason is not None:
                    out.finish_reason = step.finish_reason
                    out.spec = step.spec
                    out.latency_s = time.perf_counter() - start
                    bar.update(1)
        bar.close()
        for seq_id in order:
            out = outputs[seq_id]
            out.text = self.decode(out.token_ids)
        return [outputs[i] for i in order]

    def generate_stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield tokens and text as they are produced. Closing the iterator aborts the request."""
        _, ids = self._encode(prompt)
        seq_id = self.engine.add_request(ids, params or SamplingParams())
        detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer is not None else None
        finished = False
        try:
            while not finished and self.engine.has_unfinished():
                for step in self.engine.step():
                    if step.seq_id != seq_id:
                        continue
                    finished = step.finish_reason is not None
                    text = detok.push(step.new_token_ids) if detok is not None else ""
                    yield StreamDelta(step.new_token_ids, text, step.finish_reason, step.logprobs,
                                      step.prompt_logprobs)
        finally:
            if not finished:
                self.engine.abort(seq_id)
