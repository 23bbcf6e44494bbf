"""The OpenAI-compatible HTTP bridge: /v1/completions, /v1/chat/completions (SSE), /v1/models, /health, /metrics.

Errors leave as OpenAI-shaped bodies with the HTTP status their gRPC status maps to. A client that goes
away cancels its generation (the target call), streaming or not; /v1/ is guarded by `http_asgi.RequestGuard`.
"""

import json
from collections.abc import AsyncIterator

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.auth import ApiKeys
from gateway.choices import choice_requests, complete_all, merged_streams
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

    async def run(request: Request, req: TextRequest, sampling: _Sampling, chat: bool) -> Response:
        headers = {"x-request-id": req.request_id}
        reqs = choice_requests(req, sampling.n or 1)
        out = OpenAIResponse(req.request_id, generator.model_name, chat, len(reqs), req.params.HasField("logprobs"),
                             generator.tokenizer)
        if not sampling.stream:
            done = await unless_disconnected(complete_all(generator, reqs), request.receive)
            if done is None:  # the client left: the target calls are cancelled, their KV freed
                log.info("client disconnected; generation cancelled", request_id=req.request_id)
                return Response(status_code=499, headers=headers)  # nobody reads it (nginx's "client closed")
            return JSONResponse(out.whole(done), headers=headers)
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
        params = _params(body, body.max_tokens, body.wanted_logprobs())
        req = TextRequest(body.model, prompt, None, params, body.stop_list(), body.mode)
        return await run(request, req, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = _params(body, max_tokens, body.wanted_logprobs())
        req = TextRequest(body.model, None, messages, params, body.stop_list(), body.mode)
        return await run(request, req, body, chat=True)

    return app
