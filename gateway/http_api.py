"""The OpenAI-compatible HTTP bridge: /v1/completions, /v1/chat/completions (SSE), /v1/models, /health, /metrics,
and vLLM's /tokenize, /detokenize and /version.

Errors leave as OpenAI-shaped bodies (`gateway.http_errors`) with the HTTP status their gRPC status maps to.
A client that goes away cancels its generation (the target call), streaming or not; /v1/ is guarded by
`http_asgi.RequestGuard`. Generation and tokenizing requests hold an admission ticket (`gateway.admission`)
until their answer is sent; a request's `timeout` (or X-Request-Timeout header) is its deadline.
"""

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.admission import Admission, Ticket
from gateway.auth import ApiKeys
from gateway.choices import best_choices, choice_requests, complete_all, merged_streams
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, InvalidRequest, openai_error_body
from gateway.generation import TextDelta, TextGenerator, TextRequest
from gateway.http_asgi import RequestGuard, unless_disconnected
from gateway.http_errors import install_error_handlers
from gateway.openai_responses import OpenAIResponse
from gateway.openai_schema import (
    MAX_TARGET_REQUESTS,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    _Sampling,
)
from gateway.openapi_doc import install_openapi
from protos.ssd.v1 import common_pb2

log = structlog.get_logger(__name__)


TIMEOUT_HEADER = "x-request-timeout"  # seconds, like the body's `timeout` (the smaller one wins)


class HeldResponse(Response):
    """A response that holds its request's admission ticket until it has been sent (a stream: to its end, or
    until the client leaves), then releases it."""

    def __init__(self, inner: Response, ticket: Ticket) -> None:
        self.inner, self.ticket = inner, ticket
        self.status_code, self.background = inner.status_code, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self.inner.background = self.background
            await self.inner(scope, receive, send)
        finally:
            self.ticket.release()


def timeout_s(request: Request, body_timeout_s: float | None) -> float | None:
    """The request's timeout: the body's `timeout` or the X-Request-Timeout header, the smaller one."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return body_timeout_s
    try:
        header_s = float(raw)
    except ValueError:
        header_s = float("nan")
    if not 0 < header_s <= 86400:
        raise InvalidRequest(f"the {TIMEOUT_HEADER} header must be seconds in (0, 86400]", param=TIMEOUT_HEADER)
    return header_s if body_timeout_s is None else min(header_s, body_timeout_s)


def _params(body: _Sampling, max_tokens: int | None, logprobs: int | None) -> common_pb2.SamplingParams:
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    params = common_pb2.SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                       max_tokens=max_tokens or 0, ignore_eos=body.ignore_eos,
                                       presence_penalty=body.presence_penalty or 0.0,
                                       frequency_penalty=body.frequency_penalty or 0.0,
                                       logit_bias=body.token_bias(), repetition_penalty=body.repetition_penalty,
                                       min_p=body.min_p, min_tokens=body.min_tokens,
                                       stop_token_ids=body.stop_token_ids or [])
    if body.seed is not None:
        params.seed = body.seed
    grammar = body.grammar()
    if grammar is not None:
        params.grammar.CopyFrom(grammar)
    if logprobs is not None:
        params.logprobs = logprobs
    return params


def package_version() -> str:
    try:
        return distribution_version("ssd-serve")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def without_answer(d: TextDelta) -> TextDelta:
    """A candidate scored but not answered (echo with max_tokens=0): its one generated token is dropped."""
    return dataclasses.replace(d, text="", token_ids=[], logprobs=[], completion_tokens=0, finish_reason="length")


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def build_app(generator: TextGenerator, keys: ApiKeys, config: GatewayConfig, metrics_render,  # noqa: ANN001
              admission: Admission) -> FastAPI:
    app = FastAPI(title="ssd-serve gateway", docs_url=None, redoc_url=None)
    app.add_middleware(RequestGuard, keys=keys, max_request_bytes=config.max_request_bytes,
                       body_read_timeout_s=config.body_read_timeout_s, is_operator_guarded=config.is_metrics_guarded)
    install_error_handlers(app)
    install_openapi(app)

    async def admit(request: Request, deadline: float | None) -> Ticket:
        return await admission.admit(keys.check(request.headers.get("authorization")), deadline)

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy = [r.address for r in generator.router.replicas if r.is_healthy]
        return JSONResponse({"status": "ok" if healthy else "unavailable", "replicas": healthy},
                            status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(metrics_render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": generator.model_name, "object": "model", "created": 0,
                                            "owned_by": "ssd-serve",
                                            "max_model_len": generator.max_model_len}]}  # vLLM's extension

    @app.get("/version")
    async def version() -> dict:
        return {"version": package_version()}

    async def run(request: Request, request_id: str, prompts: list[TextRequest],
                  sampling: CompletionRequest | ChatCompletionRequest, chat: bool, echoes: list[str] | None = None,
                  score_only: bool = False) -> Response:
        """One response for every prompt's n choices (choice index = prompt index * n + i). `echoes`: per prompt,
        the text its choices start with; `score_only`: the answers (one token each) are dropped."""
        ticket = await admit(request, prompts[0].deadline)
        try:
            return HeldResponse(await respond(request, request_id, prompts, sampling, chat, echoes, score_only), ticket)
        except BaseException:
            ticket.release()
            raise

    async def respond(request: Request, request_id: str, prompts: list[TextRequest],
                      sampling: CompletionRequest | ChatCompletionRequest, chat: bool, echoes: list[str] | None,
                      score_only: bool) -> Response:
        headers = {"x-request-id": request_id}
        n, candidates = sampling.n or 1, sampling.candidates()
        out = OpenAIResponse(request_id, generator.model_name, chat, len(prompts) * n, sampling.wanted_logprobs()
                             is not None, generator.tokenizer,
                             None if echoes is None else [e for e in echoes for _ in range(n)],
                             sampling.tool_plan if isinstance(sampling, ChatCompletionRequest) else None,
                             continuous_usage=bool(sampling.stream and sampling.stream_options
                                                   and sampling.stream_options.continuous_usage_stats))
        reqs = [c for r in prompts for c in choice_requests(r, candidates)]
        if not sampling.stream:
            done = await unless_disconnected(complete_all(generator, reqs), request.receive)
            if done is None:  # the client left: the target calls are cancelled, their KV freed
                log.info("client disconnected; generation cancelled", request_id=request_id)
                return Response(status_code=499, headers=headers)  # nobody reads it (nginx's "client closed")
            if score_only:
                done = [without_answer(d) for d in done]
            groups = [done[j * candidates : (j + 1) * candidates] for j in range(len(prompts))]
            choices = [d for g in groups for d in best_choices(g, n)]
            return JSONResponse(out.whole(choices, groups), headers=headers)
        deltas = merged_streams(generator, reqs)  # candidates == n here: request i is choice i
        first = await anext(deltas)  # errors before the first token still get a proper HTTP status
        include_usage = bool(sampling.stream_options and sampling.stream_options.include_usage)

        async def body() -> AsyncIterator[bytes]:
            last: list[TextDelta | None] = [None] * len(reqs)
            try:
                if chat:
                    for i in range(len(reqs)):
                        yield _sse(out.role_chunk(i))
                last[first[0]] = first[1]
                yield _sse(out.chunk(*first))
                async for i, d in deltas:
                    last[i] = d
                    if d.text or d.logprobs or d.finish_reason is not None:
                        yield _sse(out.chunk(i, d))
                if include_usage:
                    groups = [[d for d in last[j * n : (j + 1) * n] if d is not None] for j in range(len(prompts))]
                    yield _sse(out.usage_chunk([g for g in groups if g]))
            except GatewayError as e:
                yield _sse(openai_error_body(e.http_status, str(e)))
            except Exception:  # a bug: the stream ends with a 500 event, the traceback goes to the log
                log.exception("unhandled error in a stream", request_id=request_id)
                yield _sse(openai_error_body(500, "internal server error; the gateway's log has the details"))
            finally:
                await deltas.aclose()  # client gone: cancels the target calls, freeing their KV
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    @app.post("/tokenize")
    async def tokenize(request: Request, body: TokenizeRequest) -> dict:
        """The prompt's token ids as the target would see them (vLLM's shape); chat messages through the template.
        Size-checked first, then rendered and tokenized off the event loop."""
        generator.check_model(body.model)
        req = TextRequest(body.model, body.prompt or "", [m.for_template() for m in body.messages or []] or None,
                          common_pb2.SamplingParams(), render=body.chat_render())
        generator.check_prompt_size(req)
        tok = generator.tokenizer()
        render = (lambda: tok.chat_prompt(req.messages, req.render)) if req.messages else (lambda: req.prompt)
        async with admission.slot(keys.check(request.headers.get("authorization"))):
            ids = await generator.cpu.run(lambda: tok.encode(render()))
        return {"count": len(ids), "max_model_len": generator.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request, body: DetokenizeRequest) -> dict:
        generator.check_model(body.model)
        info = generator.router.info()
        vocab = info.vocab_size if info is not None else 0
        if vocab and any(t >= vocab for t in body.tokens):
            raise InvalidRequest(f"token ids must be below the vocabulary size {vocab}", param="tokens")
        async with admission.slot(keys.check(request.headers.get("authorization"))):
            return {"prompt": await generator.cpu.run(generator.tokenizer().decode, body.tokens)}

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        prompts = body.prompts()
        n, candidates = body.n or 1, body.candidates()
        if len(prompts) * candidates > MAX_TARGET_REQUESTS:
            raise InvalidRequest(f"{len(prompts)} prompts x {candidates} choices is more than the "
                                 f"{MAX_TARGET_REQUESTS} generations one request may ask for", param="prompt")
        if candidates < n:
            raise InvalidRequest(f"best_of ({body.best_of}) must be >= n ({body.n})", param="best_of")
        if body.stream and candidates > n:
            raise InvalidRequest("best_of > n cannot be streamed: the best choices are known only once every "
                                 "candidate is done", param="best_of")
        score_only = body.echo and body.max_tokens == 0  # OpenAI's way to score a prompt: echo it, generate nothing
        if score_only and body.stream:
            raise InvalidRequest("max_tokens=0 (scoring the prompt) cannot be streamed", param="max_tokens")
        params = _params(body, 1 if score_only else body.max_tokens, body.wanted_logprobs())
        if body.echo and body.logprobs is not None:
            params.prompt_logprobs = body.logprobs
        if candidates > n and body.logprobs is None:
            params.logprobs = 0  # ranking the candidates needs each token's logprob; the response leaves them out
        request_id = uuid.uuid4().hex
        deadline = generator.deadline(timeout_s(request, body.timeout))
        reqs = [TextRequest(body.model, p, None, params, body.stop_list(), body.mode, **body.text_options(),
                            request_id=f"{request_id}-p{j}" if len(prompts) > 1 else request_id, deadline=deadline)
                for j, p in enumerate(prompts)]
        echoes = None
        if body.echo:
            echoes = [p if isinstance(p, str) else await generator.cpu.run(generator.tokenizer().decode, p)
                      for p in prompts]
        return await run(request, request_id, reqs, body, chat=False, echoes=echoes, score_only=score_only)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        messages = [m.for_template() for m in body.messages]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = _params(body, max_tokens, body.wanted_logprobs())
        plan = body.tool_plan
        render = body.chat_render(body.template_tools(), plan is not None and plan.choice == "auto")
        req = TextRequest(body.model, None, messages, params, body.stop_list(), body.mode, render=render,
                          deadline=generator.deadline(timeout_s(request, body.timeout)), **body.text_options())
        return await run(request, req.request_id, [req], body, chat=True)

    return app
