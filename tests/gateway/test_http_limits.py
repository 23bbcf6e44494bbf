"""The HTTP bridge's limits on the real app with a stub generator: 429 with Retry-After past the admission queue,
bugs as OpenAI-shaped 500s, a slow body cut off with 408, the request timeout as the generation's deadline,
the prompt-size limit before any tokenizing, and an OpenAPI document without FastAPI's 422."""

import asyncio
import json
import time

import httpx
import pytest

from gateway.admission import Admission
from gateway.config import GatewayConfig
from tests.gateway.test_http_asgi import HEADERS, LIMIT, StubGenerator, _post, assert_openai_error, make_app

COMPLETION = json.dumps({"prompt": "hi", "max_tokens": 5}).encode()


def test_past_the_queue_is_429_with_retry_after():
    async def scenario() -> tuple[int, dict, str]:
        gen = StubGenerator(is_hanging=True)
        app = make_app(gen, Admission(max_in_flight=1, max_waiting=0))
        holder = asyncio.create_task(_post(app, COMPLETION))
        await gen.started.wait()
        r = await _post(app, COMPLETION)
        holder.cancel()
        return r.status_code, r.json(), r.headers.get("retry-after", "")

    status, body, retry_after = asyncio.run(scenario())
    assert status == 429 and body["error"]["type"] == "rate_limit_error" and int(retry_after) >= 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_bug_is_an_openai_shaped_500(stream):
    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=make_app(StubGenerator(error=RuntimeError("boom"))),
                                        raise_app_exceptions=False)  # as a server: the answer is sent, then re-raised
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post("/v1/completions", json={"prompt": "hi", "stream": stream}, headers=HEADERS)

    r = asyncio.run(post())
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error" and "boom" not in r.text


def test_a_slow_body_is_408():
    async def slow():  # noqa: ANN202
        yield b'{"prompt": "hi",'
        await asyncio.sleep(1)
        yield b'"max_tokens": 5}'

    config = GatewayConfig(targets=("stub:1",), is_auth_disabled=True, max_request_bytes=LIMIT,
                           body_read_timeout_s=0.2)
    gen = StubGenerator(config=config)
    r = asyncio.run(_post(make_app(gen), slow()))
    assert r.status_code == 408 and r.json()["error"]["type"] == "timeout_error" and gen.requests == []


def test_the_request_timeout_is_the_generations_deadline():
    gen = StubGenerator()
    app = make_app(gen)
    before = time.monotonic()
    assert asyncio.run(_post(app, json.dumps({"prompt": "hi", "timeout": 30}).encode())).status_code == 200
    assert asyncio.run(_post(app, COMPLETION, headers={**HEADERS, "X-Request-Timeout": "5"})).status_code == 200
    assert asyncio.run(_post(app, COMPLETION)).status_code == 200
    (body, header, none) = (r.deadline for r in gen.requests)
    assert before + 29 < body <= time.monotonic() + 30 and before + 4 < header <= time.monotonic() + 5
    assert none is None
    r = asyncio.run(_post(app, COMPLETION, headers={**HEADERS, "X-Request-Timeout": "soon"}))
    assert_openai_error(r, 400)


def test_a_prompt_past_the_character_limit_is_refused_before_tokenizing():
    config = GatewayConfig(targets=("stub:1",), is_auth_disabled=True, max_request_bytes=LIMIT, max_prompt_chars=10)
    gen = StubGenerator(config=config)  # its tokenizer cannot encode: reaching it would be a 500
    for body in ({"prompt": "x" * 11}, {"messages": [{"role": "user", "content": "y" * 11}]}):
        r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), "/tokenize"))
        assert_openai_error(r, 400)
        assert "characters; at most 10 are allowed" in r.json()["error"]["message"]


def test_the_openapi_document_has_openai_errors_and_no_422():
    doc = make_app(StubGenerator()).openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert "422" not in op["responses"] and "500" in op["responses"], (method, path)
            if method == "post":
                error = op["responses"]["400"]["content"]["application/json"]["schema"]
                assert error == {"$ref": "#/components/schemas/Error"}
    assert "text/event-stream" in doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert "Retry-After" in doc["paths"]["/v1/completions"]["post"]["responses"]["429"]["headers"]
