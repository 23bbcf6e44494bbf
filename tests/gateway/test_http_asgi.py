"""The HTTP bridge's ASGI guard and disconnect watching, on the real app with a stub generator (no model services).

Body size limit with and without Content-Length (chunked), read no further than the limit; API keys;
a non-streaming request whose client disconnects has its generation cancelled.
"""

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import uvicorn

from gateway.admission import Admission
from gateway.auth import ApiKeys
from gateway.config import GatewayConfig
from gateway.errors import InvalidRequest
from gateway.generation import CpuPool, TextDelta, TextGenerator, TextRequest
from gateway.http_api import build_app
from protos.ssd.v1 import common_pb2

KEY = "k"
LIMIT = 4096
HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
CHUNK = b" " * 512  # JSON whitespace: an over-limit body is still a well-formed request


class StubGenerator:
    """What build_app needs of a TextGenerator: answers 'ok' at once, or hangs until cancelled."""

    check_model = TextGenerator.check_model  # the real checks, over the stub's model name, router and config
    check_prompt_size = TextGenerator.check_prompt_size
    deadline = TextGenerator.deadline
    max_model_len = TextGenerator.max_model_len
    max_prompt_tokens = TextGenerator.max_prompt_tokens
    cpu = CpuPool(2)

    def __init__(self, *, is_hanging: bool = False, error: Exception | None = None,
                 config: GatewayConfig | None = None) -> None:
        self.config = config or GatewayConfig(targets=("stub:1",), is_auth_disabled=True, max_request_bytes=LIMIT)
        self.router = SimpleNamespace(replicas=[], info=lambda: None)
        self.model_name = "stub"
        self.is_hanging = is_hanging
        self.error = error
        self.requests: list[TextRequest] = []
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    def tokenizer(self) -> SimpleNamespace:
        return SimpleNamespace(token_text=lambda token_id: f"<{token_id}>")

    async def complete(self, req: TextRequest) -> TextDelta:
        self.requests.append(req)
        self.started.set()
        if self.error is not None:
            raise self.error
        try:
            if self.is_hanging:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()  # where the real generator cancels its target call
            raise
        return TextDelta("ok", [1], "stop", prompt_tokens=3, completion_tokens=1)

    async def stream(self, req: TextRequest):  # noqa: ANN201
        self.requests.append(req)
        if self.error is not None:
            raise self.error
        yield TextDelta("o", [1], None, prompt_tokens=3, completion_tokens=1)
        await asyncio.sleep(0)  # let the other choices interleave
        yield TextDelta("k", [2], "length", prompt_tokens=3, completion_tokens=2)


def make_app(generator: StubGenerator, admission: Admission | None = None):  # noqa: ANN201
    admission = admission or Admission(generator.config.max_in_flight, generator.config.max_waiting)
    return build_app(generator, ApiKeys(frozenset({KEY}), is_disabled=False), generator.config, lambda: b"", admission)


def chunked_body(num_chunks: int, pulled: list[int]):  # noqa: ANN201
    """A completion request padded with whitespace, sent chunk by chunk; counts the chunks pulled."""
    async def chunks():  # noqa: ANN202
        for i in range(num_chunks):
            pulled.append(i)
            yield b'{"prompt": "hi", "max_tokens": 5}' if i == 0 else CHUNK
    return chunks()


async def _post(app, content, path: str = "/v1/completions", headers: dict | None = None) -> httpx.Response:  # noqa: ANN001
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        return await client.post(path, content=content, headers=headers or HEADERS)


def streamed_texts(r: httpx.Response) -> tuple[list[dict], dict[int, str]]:
    """A completions stream's events and each choice's concatenated text."""
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    texts: dict[int, str] = {}
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    return events, texts


def assert_openai_error(r: httpx.Response, status: int) -> None:
    assert r.status_code == status
    error = r.json()["error"]
    assert error["code"] == status and error["type"] == "invalid_request_error" and error["message"]


def test_chunked_body_over_the_limit_is_413_and_not_read_further():
    gen, pulled = StubGenerator(), []
    r = asyncio.run(_post(make_app(gen), chunked_body(100, pulled)))
    assert_openai_error(r, 413)
    assert f"more than {LIMIT} bytes" in r.json()["error"]["message"]
    assert len(pulled) <= LIMIT // len(CHUNK) + 2  # stopped at the limit, not after all 100 chunks
    assert gen.requests == []


def test_small_chunked_body_is_served():
    gen, pulled = StubGenerator(), []
    r = asyncio.run(_post(make_app(gen), chunked_body(3, pulled)))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "ok"
    assert gen.requests[0].prompt == "hi" and gen.requests[0].params.max_tokens == 5


def test_content_length_over_the_limit_is_413():
    gen = StubGenerator()
    r = asyncio.run(_post(make_app(gen), b'{"prompt": "hi"}' + b" " * LIMIT))
    assert_openai_error(r, 413)
    assert f"has {LIMIT + 16} bytes" in r.json()["error"]["message"]
    assert gen.requests == []


def test_missing_api_key_is_401_before_the_body_is_read():
    gen, pulled = StubGenerator(), []
    r = asyncio.run(_post(make_app(gen), chunked_body(100, pulled), headers={"Content-Type": "application/json"}))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert pulled == [] and gen.requests == []


def test_generation_errors_keep_their_status_through_the_disconnect_watch():
    gen = StubGenerator(error=InvalidRequest("the prompt is empty", param="prompt"))
    r = asyncio.run(_post(make_app(gen), b'{"prompt": "", "max_tokens": 5}'))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize(("field", "value"), [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("suffix", "end"),
])
def test_unsupported_openai_options_are_refused_not_ignored(field, value):
    gen = StubGenerator()
    body = json.dumps({"prompt": "hi", "max_tokens": 5, field: value}).encode()
    r = asyncio.run(_post(make_app(gen), body))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == field and "not supported" in r.json()["error"]["message"]
    assert gen.requests == []


def test_unsupported_openai_options_at_their_neutral_value_are_served():
    gen = StubGenerator()
    body = {"prompt": "hi", "max_tokens": 5, "presence_penalty": 0, "frequency_penalty": 0.0,
            "logit_bias": {}, "response_format": {"type": "text"}, "tool_choice": "none", "user": "u-1", "n": 1}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    assert r.status_code == 200, r.text
    assert gen.requests[0].prompt == "hi"


@pytest.mark.parametrize(("extra", "expected"), [
    ({"response_format": {"type": "json_object"}}, ("json_schema", {"type": "object"})),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}},
     ("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}})),
    ({"guided_json": {"type": "array"}}, ("json_schema", {"type": "array"})),
    ({"guided_regex": "(yes|no)"}, ("regex", "(yes|no)")),
    ({"guided_grammar": 'start: "yes" | "no"'}, ("lark", 'start: "yes" | "no"')),
    ({"guided_choice": ["yes", "no (maybe)"]}, ("regex", r"(yes|no \(maybe\))")),
    ({"response_format": {"type": "text"}}, None),
])
def test_structured_output_reaches_the_target_as_a_grammar(extra, expected):
    gen = StubGenerator()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), "/v1/chat/completions"))
    assert r.status_code == 200, r.text
    params = gen.requests[0].params
    if expected is None:
        assert not params.HasField("grammar")
        return
    kind = params.grammar.WhichOneof("kind")
    text = getattr(params.grammar, kind)
    assert (kind, json.loads(text) if kind == "json_schema" else text) == expected


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "response_format"),
    ({"guided_regex": "a+", "guided_grammar": 'start: "a"'}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", ""]}, "guided_choice.1"),
])
def test_bad_structured_output_requests_are_refused(extra, param):
    gen = StubGenerator()
    body = json.dumps({"prompt": "hi", "max_tokens": 5, **extra}).encode()
    r = asyncio.run(_post(make_app(gen), body))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == param
    assert gen.requests == []


def test_n_choices_are_separate_requests_with_their_own_seeds():
    gen = StubGenerator()
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 5, "temperature": 0.7}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), "/v1/chat/completions"))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == "ok" for c in out["choices"])
    assert out["usage"]["prompt_tokens"] == 3 and out["usage"]["completion_tokens"] == 3
    assert sorted(q.params.seed for q in gen.requests) == [5, 6, 7]
    assert len({q.request_id for q in gen.requests}) == 3


def test_n_choices_stream_interleaved_with_their_index():
    gen = StubGenerator()
    body = {"prompt": "hi", "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    events, texts = streamed_texts(r)
    assert texts == {0: "ok", 1: "ok"}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    assert r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("stream", [False, True])
def test_an_error_in_the_choices_is_the_http_status(stream):
    gen = StubGenerator(error=InvalidRequest("the prompt is empty", param="prompt"))
    body = {"prompt": "", "n": 2, "stream": stream}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("n", [0, 17, "two"])
def test_bad_n_is_a_400(n):
    r = asyncio.run(_post(make_app(StubGenerator()), json.dumps({"prompt": "hi", "n": n}).encode()))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == "n"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 21}, "top_logprobs"),
])
def test_bad_logprobs_requests_are_a_400_naming_the_field(path, body, param):
    gen = StubGenerator()
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), path))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == param
    assert gen.requests == []


@pytest.mark.parametrize(("field", "value"), [("presence_penalty", 2.5), ("frequency_penalty", -2.1),
                                               ("presence_penalty", "high"), ("logit_bias", {"x1": 1}), ("logit_bias", {"²": 1}), ("logit_bias", {"99999999999": 1}),
                                               ("logit_bias", {"5": 101}), ("logit_bias", [5])])
def test_bad_penalties_and_biases_are_a_400(field, value):
    r = asyncio.run(_post(make_app(StubGenerator()), json.dumps({"prompt": "hi", field: value}).encode()))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == field


class RankedStub(StubGenerator):
    """Candidate with seed s answers f"answer-{s}" whose tokens have logprob -LOGPROB_BY_SEED[s] each."""

    LOGPROB_BY_SEED = {10: 2.0, 11: 0.5, 12: 1.0, 13: 3.0}

    async def complete(self, req: TextRequest) -> TextDelta:
        self.requests.append(req)
        lp = -self.LOGPROB_BY_SEED[req.params.seed]
        logprobs = [common_pb2.TokenLogprob(token_id=t, logprob=lp) for t in (1, 2)]
        return TextDelta(f"answer-{req.params.seed}", [1, 2], "length", prompt_tokens=3, completion_tokens=2,
                         logprobs=logprobs)


@pytest.mark.parametrize("logprobs", [None, 1])
def test_best_of_returns_the_n_likeliest_candidates_and_counts_them_all(logprobs):
    gen = RankedStub()
    body = {"prompt": "hi", "best_of": 4, "n": 2, "seed": 10, "temperature": 1.0, "logprobs": logprobs}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["text"] for c in out["choices"]] == ["answer-11", "answer-12"]  # mean logprob -0.5, then -1.0
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["usage"]["completion_tokens"] == 8  # every candidate's tokens
    assert sorted(q.params.seed for q in gen.requests) == [10, 11, 12, 13]
    assert all(q.params.logprobs == (logprobs or 0) for q in gen.requests)  # asked for, to rank them
    if logprobs is None:
        assert all(c["logprobs"] is None for c in out["choices"])  # not shown unless asked for
    else:
        assert out["choices"][0]["logprobs"]["token_logprobs"] == [-0.5, -0.5]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "hi", "best_of": 2, "n": 3}),
    ("/v1/completions", {"prompt": "hi", "best_of": 3, "stream": True}),
    ("/v1/completions", {"prompt": "hi", "best_of": 17}),
    ("/v1/completions", {"prompt": "hi", "best_of": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "best_of": 2}),
])
def test_bad_best_of_is_a_400_naming_it(path, body):
    gen = StubGenerator()
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), path))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == "best_of"
    assert gen.requests == []


def test_best_of_equal_to_n_streams():
    gen = StubGenerator()
    body = {"prompt": "hi", "best_of": 2, "n": 2, "stream": True}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert len(gen.requests) == 2 and not gen.requests[0].params.HasField("logprobs")


class EchoStub(StubGenerator):
    """The prompt is tokens 7 8 9 (prompt logprobs -1, -2 when asked); the answer token 1 (logprob -0.5)."""

    async def complete(self, req: TextRequest) -> TextDelta:
        self.requests.append(req)
        scored = req.params.HasField("prompt_logprobs")
        prompt_lps = [common_pb2.TokenLogprob(token_id=t, logprob=v) for t, v in ((8, -1.0), (9, -2.0))] if scored else []
        answer_lps = [common_pb2.TokenLogprob(token_id=1, logprob=-0.5)] if req.params.HasField("logprobs") else []
        return TextDelta("ok", [1], "length", prompt_tokens=3, completion_tokens=1, logprobs=answer_lps,
                         prompt_logprobs=prompt_lps, prompt_token_ids=[7, 8, 9])

    async def stream(self, req: TextRequest):  # noqa: ANN201
        yield await self.complete(req)


def test_echo_leads_with_the_prompt_and_its_logprobs():
    gen = EchoStub()
    r = asyncio.run(_post(make_app(gen), json.dumps({"prompt": "abc", "echo": True, "logprobs": 0}).encode()))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "abcok"
    assert choice["logprobs"] == {"tokens": ["<7>", "<8>", "<9>", "<1>"], "token_logprobs": [None, -1.0, -2.0, -0.5],
                                  "top_logprobs": [None, {}, {}, {}], "text_offset": [0, 3, 6, 9]}
    assert gen.requests[0].params.prompt_logprobs == 0

    r = asyncio.run(_post(make_app(gen), json.dumps({"prompt": "abc", "echo": True}).encode()))
    assert r.json()["choices"][0] == {"index": 0, "finish_reason": "length", "logprobs": None, "text": "abcok"}
    assert not gen.requests[1].params.HasField("prompt_logprobs")  # echoing text alone needs no scoring

    body = {"prompt": "abc", "echo": True, "stream": True, "logprobs": 0}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events) == "abcok"
    assert events[0]["choices"][0]["logprobs"]["token_logprobs"] == [None, -1.0, -2.0, -0.5]


def test_echo_with_max_tokens_0_scores_the_prompt_only():
    gen = EchoStub()
    body = {"prompt": "abc", "echo": True, "logprobs": 1, "max_tokens": 0}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["text"] == "abc" and out["choices"][0]["logprobs"]["token_logprobs"] == [None, -1.0, -2.0]
    assert out["usage"]["completion_tokens"] == 0 and gen.requests[0].params.max_tokens == 1
    for bad in ({"prompt": "abc", "max_tokens": 0}, {"prompt": "abc", "echo": True, "max_tokens": 0, "stream": True}):
        r = asyncio.run(_post(make_app(gen), json.dumps(bad).encode()))
        assert_openai_error(r, 400)
        assert r.json()["error"]["param"] == "max_tokens"


def test_echo_on_chat_is_refused():
    body = {"messages": [{"role": "user", "content": "hi"}], "echo": True}
    r = asyncio.run(_post(make_app(StubGenerator()), json.dumps(body).encode(), "/v1/chat/completions"))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"] == "echo"


def test_several_prompts_and_token_id_prompts():
    gen = StubGenerator()
    r = asyncio.run(_post(make_app(gen), json.dumps({"prompt": ["a", "b"], "n": 2, "seed": 1}).encode()))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert sorted((q.prompt, q.params.seed) for q in gen.requests) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert out["usage"]["prompt_tokens"] == 6 and out["usage"]["completion_tokens"] == 4  # each prompt once
    assert len({q.request_id for q in gen.requests}) == 4

    for prompt, expected in (([5, 6, 7], [[5, 6, 7]]), ([[5, 6], [7]], [[5, 6], [7]])):
        gen = StubGenerator()
        r = asyncio.run(_post(make_app(gen), json.dumps({"prompt": prompt}).encode()))
        assert r.status_code == 200, r.text
        assert [q.prompt for q in gen.requests] == expected

    body = {"prompt": [["x"]], "stream": True}
    assert asyncio.run(_post(make_app(StubGenerator()), json.dumps(body).encode())).status_code == 400


@pytest.mark.parametrize("prompt", [[], ["a", 1], [[1], "a"], [True], 5, [[1.5]], [2**31], [[-1]]])
def test_malformed_prompts_are_a_400(prompt):
    gen = StubGenerator()
    r = asyncio.run(_post(make_app(gen), json.dumps({"prompt": prompt}).encode()))
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"].startswith("prompt")
    assert gen.requests == []


def test_too_many_generations_in_one_request_are_a_400():
    body = {"prompt": ["a"] * 17, "n": 16}
    r = asyncio.run(_post(make_app(StubGenerator()), json.dumps(body).encode()))
    assert_openai_error(r, 400)
    assert "256" in r.json()["error"]["message"]


def test_streamed_choices_of_several_prompts_have_their_own_index():
    gen = StubGenerator()
    body = {"prompt": ["a", "b"], "stream": True, "echo": True, "stream_options": {"include_usage": True}}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode()))
    events, texts = streamed_texts(r)
    assert texts == {0: "aok", 1: "bok"}
    assert events[-1]["usage"]["prompt_tokens"] == 6


def test_penalties_and_biases_reach_the_target_params():
    gen = StubGenerator()
    body = {"prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": -1, "logit_bias": {"50256": -100}}
    assert asyncio.run(_post(make_app(gen), json.dumps(body).encode())).status_code == 200
    params = gen.requests[0].params
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.0)
    assert dict(params.logit_bias) == {50256: -100.0}


def test_vllm_sampling_extensions_reach_the_target_params():
    gen = StubGenerator()
    body = {"prompt": "hi", "repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 4, "stop_token_ids": [7, 9]}
    assert asyncio.run(_post(make_app(gen), json.dumps(body).encode())).status_code == 200
    params = gen.requests[0].params
    assert (params.repetition_penalty, params.min_tokens, list(params.stop_token_ids)) == (pytest.approx(1.2), 4, [7, 9])
    assert params.min_p == pytest.approx(0.1)
    for field, value in (("repetition_penalty", 0), ("min_p", 2), ("min_tokens", -1), ("stop_token_ids", ["a"]),
                         ("stop_token_ids", [2**40])):
        r = asyncio.run(_post(make_app(gen), json.dumps({"prompt": "hi", field: value}).encode()))
        assert_openai_error(r, 400)
        assert r.json()["error"]["param"].startswith(field)


def test_logprobs_reach_the_target_params():
    gen = StubGenerator()
    asyncio.run(_post(make_app(gen), json.dumps({"prompt": "hi", "logprobs": 2}).encode()))
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    asyncio.run(_post(make_app(gen), json.dumps(chat).encode(), "/v1/chat/completions"))
    asyncio.run(_post(make_app(gen), json.dumps({"prompt": "hi"}).encode()))
    assert [r.params.logprobs if r.params.HasField("logprobs") else None for r in gen.requests] == [2, 0, None]


@pytest.fixture
def served_app():
    """The app behind a real uvicorn on a free port (real chunked framing and keep-alive)."""
    server = uvicorn.Server(uvicorn.Config(make_app(StubGenerator()), host="127.0.0.1", port=0,
                                           log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_chunked_limit_over_a_real_connection(served_app):
    def body(num_chunks: int):  # noqa: ANN202
        yield b'{"prompt": "hi", "max_tokens": 5}'
        yield from (CHUNK for _ in range(num_chunks))

    with httpx.Client(base_url=served_app, headers=HEADERS, timeout=10) as client:
        big = client.post("/v1/completions", content=body(40))
        assert "content-length" not in big.request.headers and big.request.headers["transfer-encoding"] == "chunked"
        assert_openai_error(big, 413)
        small = client.post("/v1/completions", content=body(2))  # the same connection still serves
        assert small.status_code == 200 and small.json()["choices"][0]["text"] == "ok"


def test_disconnect_cancels_a_nonstreaming_generation():
    async def scenario() -> list[dict]:
        gen = StubGenerator(is_hanging=True)
        app = make_app(gen)
        body = b'{"prompt": "hi", "max_tokens": 2000}'
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "root_path": "", "server": ("gateway", 80), "client": ("test", 1),
                 "headers": [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        gone = asyncio.Event()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            await gone.wait()  # as a server does: block until the client goes away
            return {"type": "http.disconnect"}

        sent = []

        async def send(message: dict) -> None:
            sent.append(message)

        app_task = asyncio.create_task(app(scope, receive, send))
        await asyncio.wait_for(gen.started.wait(), 5)
        await asyncio.sleep(0.2)
        assert not gen.cancelled.is_set()  # still generating while the client waits
        gone.set()
        await asyncio.wait_for(gen.cancelled.wait(), 2)
        await asyncio.wait_for(app_task, 2)
        return sent

    sent = asyncio.run(scenario())
    assert sent[0]["status"] == 499


def test_guided_choice_regex_matches_exactly_its_strings():
    import re

    from gateway.openai_schema import choice_regex

    choices = ["a.b (c)", "x|y", "price: $5+", "50% off [now]", "a-b & c ~ d #e", "ünïcode ☕", "back\\slash", "{j}"]
    regex = choice_regex(choices)
    assert all(re.fullmatch(regex, c) for c in choices)
    assert not any(re.fullmatch(regex, c) for c in ["a_b (c)", "x", "price: $55", "{j}{j}", "back\\\\slash"])


def test_vllm_text_options_reach_the_text_request_and_echo_refuses_truncation():
    gen = StubGenerator()
    body = {"prompt": "hi", "max_tokens": 5, "include_stop_str_in_output": True, "truncate_prompt_tokens": 7}
    assert asyncio.run(_post(make_app(gen), json.dumps(body).encode())).status_code == 200
    assert gen.requests[0].include_stop and gen.requests[0].truncate_prompt_tokens == 7
    r = asyncio.run(_post(make_app(gen), json.dumps({**body, "echo": True}).encode()))
    assert_openai_error(r, 400)
    assert "truncate_prompt_tokens" in r.json()["error"]["message"]


def test_continuous_usage_stats_put_each_choices_usage_so_far_in_every_chunk():
    body = {"prompt": "hi", "max_tokens": 5, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    r = asyncio.run(_post(make_app(StubGenerator()), json.dumps(body).encode()))
    events, texts = streamed_texts(r)
    assert texts == {0: "ok"}
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2]
    assert all(e["usage"]["prompt_tokens"] == 3 and e["usage"]["total_tokens"] == 3 + e["usage"]["completion_tokens"]
               for e in events)
