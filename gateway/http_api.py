"""The OpenAI-compatible HTTP bridge: /v1/completions, /v1/chat/completions (SSE), /v1/models, /health, /metrics.

Errors leave as OpenAI-shaped bodies with the HTTP status their gRPC status maps to. A client that goes
away cancels its generation (the target call), streaming or not; /v1/ is guarded by `http_asgi.RequestGuard`.
"""

import dataclasses
import json
from collections.abc import AsyncIterator

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.auth import ApiKeys
from gateway.choices import best_choices, choice_requests, complete_all, merged_streams
from gateway.errors import GatewayError, InvalidRequest, openai_error_body
from gateway.generation import TextDelta, TextGenerator, TextRequest
from gateway.http_asgi import RequestGuard, unless_disconnected
from gateway.openai_responses import OpenAIResponse
from gateway.openai_schema import ChatCompletionRequest, CompletionRequest, _Sampling
from protos.ssd.v1 import common_pb2

log = structlog.get_logger(__name__)


def _params(body: _Sampling, max_tokens: int | None, logprobs: int | None) -> common_pb2.SamplingParams:
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    params = common_pb2.SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                       max_tokens=max_tokens or 0, ignore_eos=body.ignore_eos,
                                       presence_penalty=body.presence_penalty or 0.0,
                                       frequency_penalty=body.frequency_penalty or 0.0,
                                       logit_bias=body.token_bias())
    if body.seed is not None:
        params.seed = body.seed
    if logprobs is not None:
        params.logprobs = logprobs
    return params


def without_answer(d: TextDelta) -> TextDelta:
    """A candidate scored but not answered (echo with max_tokens=0): its one generated token is dropped."""
    return dataclasses.replace(d, text="", token_ids=[], logprobs=[], completion_tokens=0, finish_reason="length")


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def build_app(generator: TextGenerator, keys: ApiKeys, max_request_bytes: int, metrics_render) -> FastAPI:  # noqa: ANN001
    app = FastAPI(title="ssd-serve gateway", docs_url=None, redoc_url=None)
    app.add_middleware(RequestGuard, keys=keys, max_request_bytes=max_request_bytes)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, e: GatewayError) -> JSONResponse:
        return JSONResponse(openai_error_body(e.http_status, str(e), e.param), status_code=e.http_status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        message = f"invalid request body: {loc + ': ' if loc else ''}{first.get('msg', 'malformed')}"
        return JSONResponse(openai_error_body(400, message, loc or None), status_code=400)

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
                                            "owned_by": "ssd-serve"}]}

    async def run(request: Request, req: TextRequest, sampling: CompletionRequest | ChatCompletionRequest,
                  chat: bool, echo: str | None = None, score_only: bool = False) -> Response:
        """`echo`: the prompt text the choices start with; `score_only`: the answer (one token) is dropped."""
        headers = {"x-request-id": req.request_id}
        n = sampling.n or 1
        out = OpenAIResponse(req.request_id, generator.model_name, chat, n, req.params.HasField("logprobs"),
                             generator.tokenizer, echo)
        if sampling.candidates() > n and not req.params.HasField("logprobs"):
            req.params.logprobs = 0  # ranking needs each token's logprob; the response leaves them out
        reqs = choice_requests(req, sampling.candidates())
        if not sampling.stream:
            done = await unless_disconnected(complete_all(generator, reqs), request.receive)
            if done is None:  # the client left: the target calls are cancelled, their KV freed
                log.info("client disconnected; generation cancelled", request_id=req.request_id)
                return Response(status_code=499, headers=headers)  # nobody reads it (nginx's "client closed")
            if score_only:
                done = [without_answer(d) for d in done]
            return JSONResponse(out.whole(best_choices(done, n), usage_of=done), headers=headers)
        deltas = merged_streams(generator, reqs)
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
                    yield _sse(out.usage_chunk([d for d in last if d is not None]))
            except GatewayError as e:
                yield _sse(openai_error_body(e.http_status, str(e)))
            finally:
                await deltas.aclose()  # client gone: cancels the target calls, freeing their KV
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest("exactly one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if body.candidates() < (body.n or 1):
            raise InvalidRequest(f"best_of ({body.best_of}) must be >= n ({body.n})", param="best_of")
        if body.stream and body.candidates() > (body.n or 1):
            raise InvalidRequest("best_of > n cannot be streamed: the best choices are known only once every "
                                 "candidate is done", param="best_of")
        score_only = body.echo and body.max_tokens == 0  # OpenAI's way to score a prompt: echo it, generate nothing
        if score_only and body.stream:
            raise InvalidRequest("max_tokens=0 (scoring the prompt) cannot be streamed", param="max_tokens")
        params = _params(body, 1 if score_only else body.max_tokens, body.wanted_logprobs())
        if body.echo and body.logprobs is not None:
            params.prompt_logprobs = body.logprobs
        req = TextRequest(body.model, prompt, None, params, body.stop_list(), body.mode)
        return await run(request, req, body, chat=False, echo=prompt if body.echo else None, score_only=score_only)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = _params(body, max_tokens, body.wanted_logprobs())
        req = TextRequest(body.model, None, messages, params, body.stop_list(), body.mode)
        return await run(request, req, body, chat=True)

    return app
