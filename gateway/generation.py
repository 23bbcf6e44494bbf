"""Text-level generation shared by the gRPC API and the HTTP bridge.

Tokenize (chat template), validate, route, stream token ids from a target, detokenize
incrementally, apply stop strings, count usage, record metrics. A request that has streamed
nothing is retried on another replica when its target is UNAVAILABLE. Leaving the iterator early
(client gone, stop string) cancels the target call, which aborts the request and frees its KV.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import grpc
import structlog

from gateway.config import GatewayConfig
from gateway.errors import DeadlineExceeded, InvalidRequest, ModelNotFound, NoReplica, UpstreamError
from gateway.metrics import GatewayMetrics, ModelSeries
from gateway.request_checks import CHARS_PER_TOKEN, check_params, check_prompt_size, check_token_ids
from gateway.router import Router
from gateway.tokenizer import ChatRender, IncrementalDetokenizer, StopStrings, TextTokenizer
from protos.ssd.v1 import common_pb2, target_pb2

log = structlog.get_logger(__name__)

T = TypeVar("T")

FINISH_NAMES = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length",
                common_pb2.FINISH_REASON_ABORT: "abort"}
MODES = {"ar": common_pb2.SPECULATION_MODE_AR, "sd": common_pb2.SPECULATION_MODE_SD,
         "ssd": common_pb2.SPECULATION_MODE_SSD, "auto": common_pb2.SPECULATION_MODE_AUTO,
         None: common_pb2.SPECULATION_MODE_UNSPECIFIED}


@dataclass(frozen=True)
class TextRequest:
    model: str | None  # None / "" = the served model
    prompt: str | list[int] | None  # a raw prompt (text, or token ids sent as they are), or
    messages: list[dict] | None  # chat messages (the template is applied)
    params: common_pb2.SamplingParams  # max_tokens 0 = the default
    stop: tuple[str, ...] = ()
    mode: str | None = None  # "ar" | "sd" | "ssd" | "auto" | None (the target's default)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    render: ChatRender = field(default_factory=ChatRender)  # how `messages` become the prompt
    include_stop: bool = False  # vLLM's include_stop_str_in_output: the stop string that ended the text stays
    truncate_prompt_tokens: int | None = None  # vLLM's: keep only the prompt's last N tokens
    deadline: float | None = None  # time.monotonic() by which the request must be done; None = no deadline


@dataclass
class TextDelta:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort", on the last delta
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    spec: common_pb2.SpeculationStats | None = None
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)  # per token id, when asked
    prompt_logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)  # first delta: prompt tokens 1..
    prompt_token_ids: list[int] = field(default_factory=list)  # first delta only: the prompt as the target saw it


class CpuPool:
    """The gateway's CPU work (tokenizing, chat templates) on a few threads, so the event loop keeps serving.
    The tokenizer releases the GIL while it encodes (`TextTokenizer.encode`)."""

    def __init__(self, num_threads: int) -> None:
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="gateway-cpu")

    async def run(self, fn: Callable[..., T], /, *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class TextGenerator:
    def __init__(self, config: GatewayConfig, router: Router, metrics: GatewayMetrics) -> None:
        self.config = config
        self.router = router
        self.metrics = metrics
        self.cpu = CpuPool(config.num_cpu_threads)
        self._tokenizer: TextTokenizer | None = None

    @property
    def model_name(self) -> str:
        info = self.router.info()
        return self.config.model_name or (info.model_name if info is not None else "unknown")

    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            info = self.router.info()
            if info is None:
                raise NoReplica("no target replica has answered yet; retry shortly")
            self._tokenizer = TextTokenizer(info.tokenizer)
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """The served model's context length; 0 until a replica has answered."""
        info = self.router.info()
        return info.max_model_len if info is not None else 0

    def check_model(self, name: str | None) -> None:
        """ModelNotFound unless `name` is empty or the served model."""
        if name and name != self.model_name:
            raise ModelNotFound(f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                                param="model")

    @property
    def max_prompt_tokens(self) -> int:
        return self.config.max_prompt_tokens or max(1, self.max_model_len - 1)

    @property
    def vocab_size(self) -> int:
        """The served model's vocabulary size; 0 until a replica has answered."""
        info = self.router.info()
        return info.vocab_size if info is not None else 0

    def deadline(self, timeout_s: float | None) -> float | None:
        """The monotonic deadline of a request that asked for `timeout_s` (None: the configured default)."""
        timeout_s = timeout_s if timeout_s is not None else self.config.default_timeout_s
        return None if timeout_s is None else time.monotonic() + timeout_s

    def check_prompt_size(self, req: TextRequest) -> None:
        """InvalidRequest when the prompt's text is past the configured characters or bytes (before tokenizing)."""
        if isinstance(req.prompt, list):
            return
        max_chars = self.config.max_prompt_chars or CHARS_PER_TOKEN * self.max_prompt_tokens
        parts = [req.prompt, req.messages, req.render.tools, req.render.template_kwargs]
        check_prompt_size(parts, max_chars, self.config.max_prompt_bytes,
                          "messages" if req.messages is not None else "prompt")

    async def prepare(self, req: TextRequest) -> tuple[list[int], common_pb2.SamplingParams]:
        """Prompt token ids and final sampling params; raises InvalidRequest / ModelNotFound. The prompt is
        size-checked, then rendered and tokenized off the event loop."""
        self.check_model(req.model)
        if req.mode not in MODES:
            raise InvalidRequest(f"mode must be 'ar', 'sd', 'ssd' or 'auto', got {req.mode!r}", param="mode")
        check_params(req.params, self.vocab_size)
        ids = await self.prompt_ids(req)
        if req.truncate_prompt_tokens:
            ids = ids[-req.truncate_prompt_tokens :]
        max_len, limit = self.max_model_len, self.max_prompt_tokens
        if len(ids) > limit:
            raise InvalidRequest(f"the prompt has {len(ids)} tokens; at most {limit} are allowed", param="prompt")
        params = common_pb2.SamplingParams()
        params.CopyFrom(req.params)
        if params.max_tokens == 0:
            params.max_tokens = self.config.default_max_tokens
        if max_len:
            params.max_tokens = max(1, min(params.max_tokens, max_len - len(ids)))
        return ids, params

    async def prompt_ids(self, req: TextRequest) -> list[int]:
        """The prompt's token ids as the target will see them (the chat template applied to messages)."""
        if isinstance(req.prompt, list):  # token ids, sent as they are
            check_token_ids(req.prompt, self.vocab_size, "prompt")
            ids = list(req.prompt)
        else:
            self.check_prompt_size(req)
            ids = await self.cpu.run(self._encode_prompt, req)
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        return ids

    def _encode_prompt(self, req: TextRequest) -> list[int]:
        """On a CPU thread: the text prompt (or the rendered chat) tokenized."""
        tok = self.tokenizer()
        return tok.encode(tok.chat_prompt(req.messages, req.render) if req.messages is not None else req.prompt or "")

    async def stream(self, req: TextRequest) -> AsyncIterator[TextDelta]:
        ids, params = await self.prepare(req)
        structlog.contextvars.bind_contextvars(request_id=req.request_id)
        start = time.perf_counter()
        detok = IncrementalDetokenizer(self.tokenizer())
        stops = StopStrings(list(req.stop), include=req.include_stop)
        target_req = target_pb2.VerifierGenerateRequest(request_id=req.request_id, prompt_token_ids=ids,
                                                        params=params, mode=MODES[req.mode])
        num_tokens, last_time, tried, sent_prompt, num_cached = 0, None, set(), False, 0
        series = self.metrics.for_model(self.model_name)
        series.prompt_tokens.inc(len(ids))
        series.request_max_tokens.observe(params.max_tokens)
        if params.HasField("grammar"):
            self.metrics.constrained.labels(params.grammar.WhichOneof("kind") or "none").inc()
        while True:
            replica = await self.router.pick(ids, tried)
            call = replica.stub.Generate(target_req, timeout=_time_left(req.deadline))
            replica.num_outstanding_tokens += params.max_tokens
            try:
                async for msg in call:
                    now = time.perf_counter()
                    n = len(msg.token_ids)
                    if n:
                        if last_time is None:
                            series.ttft.observe(now - start)
                        else:
                            for _ in range(n):
                                series.itl.observe((now - last_time) / n)
                        last_time = now
                    num_tokens += n
                    num_cached = num_cached or msg.num_cached_prompt_tokens  # the target sends it once, first
                    series.generation_tokens.inc(n)
                    is_last = msg.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
                    text = stops.push(detok.push(list(msg.token_ids)), is_last=is_last)
                    finish = "stop" if stops.is_stopped else FINISH_NAMES.get(msg.finish_reason)
                    delta = TextDelta(text, list(msg.token_ids), finish, len(ids), num_tokens,
                                      num_cached, logprobs=list(msg.logprobs),
                                      prompt_logprobs=list(msg.prompt_logprobs),
                                      prompt_token_ids=[] if sent_prompt else ids)
                    sent_prompt = True
                    if finish is not None:
                        delta.spec = msg.spec if msg.HasField("spec") else None
                        self._finished(delta, start, series)
                        yield delta
                        return
                    yield delta
                return
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and num_tokens == 0:
                    self.router.mark_down(replica)
                    tried.add(replica.address)
                    self.metrics.retries.inc()
                    log.warning("target unavailable; retrying elsewhere", replica=replica.address)
                    continue
                self.metrics.errors.labels(e.code().name).inc()
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and req.deadline is not None:
                    raise DeadlineExceeded("the request did not finish within its timeout") from e
                raise UpstreamError(e.code(), e.details() or e.code().name) from e
            finally:
                replica.num_outstanding_tokens -= params.max_tokens
                call.cancel()  # no-op when finished; aborts the target request otherwise

    def _finished(self, delta: TextDelta, start: float, series: ModelSeries) -> None:
        """Request-level metrics; the speculation counters are the target's (its own /metrics)."""
        series.e2e.observe(time.perf_counter() - start)
        series.request_prompt_tokens.observe(delta.prompt_tokens)
        series.request_generation_tokens.observe(delta.completion_tokens)
        series.success[delta.finish_reason].inc()
        log.info("finished", finish_reason=delta.finish_reason, prompt_tokens=delta.prompt_tokens,
                 completion_tokens=delta.completion_tokens, cached_prompt_tokens=delta.cached_prompt_tokens)

    async def complete(self, req: TextRequest) -> TextDelta:
        """The whole completion as one delta (text and token ids concatenated)."""
        text, ids, logprobs, prompt_logprobs, prompt_ids, last = [], [], [], [], [], None
        async for delta in self.stream(req):
            text.append(delta.text)
            ids.extend(delta.token_ids)
            logprobs.extend(delta.logprobs)
            prompt_logprobs.extend(delta.prompt_logprobs)
            prompt_ids.extend(delta.prompt_token_ids)
            last = delta
        assert last is not None  # stream() always ends with a finish delta or raises
        return TextDelta("".join(text), ids, last.finish_reason, last.prompt_tokens, last.completion_tokens,
                         last.cached_prompt_tokens, last.spec, logprobs, prompt_logprobs, prompt_ids)


def _time_left(deadline: float | None) -> float | None:
    """Seconds to `deadline` for the target call's gRPC deadline; DeadlineExceeded once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the request did not finish within its timeout")
    return left
