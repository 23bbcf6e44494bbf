"""The gateway's limits against a real gateway process (fake fast target, tests/integration/fake_target.py):
bad input gets an OpenAI-shaped 4xx over a real connection (never a reset or a 500), a huge prompt does not
stall other requests, deadlines end in 504 / DEADLINE_EXCEEDED, a slow body in 408, the gRPC API refuses what
HTTP refuses, and --guard-metrics puts /metrics and /openapi.json behind the key."""

import json
import socket
import threading
import time

import grpc
import httpx
import pytest

from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.gateway_stack import API_KEY, AUTH, fake_stack

CHAT = "/v1/chat/completions"
GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
GRPC_AUTH = (("authorization", f"Bearer {API_KEY}"),)


@pytest.fixture(scope="module")
def fake(tmp_path_factory, default_model_path):  # noqa: ANN001, ANN201
    flags = ("--max-prompt-chars", "4000000", "--max-prompt-bytes", "4000000", "--guard-metrics",
             "--body-read-timeout-s", "1")
    with fake_stack(tmp_path_factory.mktemp("fake-limits"), default_model_path, flags, num_tokens=100,
                    token_delay_s=0.05) as s:
        yield s


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    return error


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT, {**GOOD, "max_tokens": 2**31}, "max_tokens"),
    (CHAT, {**GOOD, "max_completion_tokens": 2**40}, "max_completion_tokens"),
    (CHAT, {**GOOD, "top_k": 2**40}, "top_k"),
    (CHAT, {**GOOD, "min_tokens": 2**40}, "min_tokens"),
    (CHAT, {**GOOD, "seed": 2**70}, "seed"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2**31}, "max_tokens"),
    (CHAT, {**GOOD, "stop_token_ids": [49152]}, "stop_token_ids"),
])
def test_out_of_range_integers_are_400_naming_the_field(fake, path, body, param):
    r = httpx.post(fake.url + path, json=body, headers=AUTH, timeout=30)
    assert assert_openai_error(r, 400)["param"] == param


@pytest.mark.parametrize(("path", "raw"), [
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}'),
    ("/tokenize", b'{"prompt": "\\udfff"}'),
    (CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),  # not UTF-8 at all
    (CHAT, b"[" * 100_000 + b"]" * 100_000),
    (CHAT, b'{"messages": ' + b'{"a": ' * 500 + b"1" + b"}" * 500 + b"}"),
])
def test_bodies_that_are_not_text_or_too_deep_are_400(fake, path, raw):
    r = httpx.post(fake.url + path, content=raw, headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
    assert_openai_error(r, 400)


def test_unknown_routes_and_methods_are_openai_shaped(fake):
    assert_openai_error(httpx.get(fake.url + "/v1/nothing", headers=AUTH, timeout=10), 404)
    assert_openai_error(httpx.get(fake.url + CHAT, headers=AUTH, timeout=10), 405)
    assert_openai_error(httpx.post(fake.url + "/health", timeout=10), 405)


def test_a_huge_prompt_does_not_stall_other_requests(fake):
    """Tokenizing 4 x 900 KB prompts (then refused: too many tokens) runs off the event loop: /health and
    a small generation answer meanwhile."""
    results: list[int] = []

    def big() -> None:
        body = {"prompt": "word, other " * 75_000, "max_tokens": 2}
        results.append(httpx.post(fake.url + "/v1/completions", json=body, headers=AUTH, timeout=120).status_code)

    threads = [threading.Thread(target=big) for _ in range(4)]
    for t in threads:
        t.start()
    answered_meanwhile = 0
    while any(t.is_alive() for t in threads):
        assert httpx.get(fake.url + "/health", timeout=30).status_code == 200
        answered_meanwhile += any(t.is_alive() for t in threads)
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert results == [400] * 4
    assert answered_meanwhile >= 1
    r = httpx.post(fake.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text


def test_timeout_ends_in_504(fake):
    slow = {"prompt": "hi", "max_tokens": 100}  # 100 tokens x 50 ms
    r = httpx.post(fake.url + "/v1/completions", json={**slow, "timeout": 0.5}, headers=AUTH, timeout=30)
    assert assert_openai_error(r, 504)["type"] == "timeout_error"
    r = httpx.post(fake.url + "/v1/completions", json=slow, headers={**AUTH, "X-Request-Timeout": "0.5"}, timeout=30)
    assert_openai_error(r, 504)
    r = httpx.post(fake.url + "/v1/completions", json={**slow, "stream": True, "timeout": 0.5}, headers=AUTH,
                   timeout=30)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == 504 and r.text.endswith("data: [DONE]\n\n")
    fast = httpx.post(fake.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "timeout": 30},
                      headers=AUTH, timeout=30)
    assert fast.status_code == 200, fast.text


def test_a_slow_body_is_cut_off_with_408(fake):
    host, port = fake.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
        chunks = []  # the rest never comes: the gateway answers within the read timeout, then closes
        while chunk := s.recv(65536):  # headers and body may come in separate segments
            chunks.append(chunk)
        answer = b"".join(chunks).decode()
    assert answer.startswith("HTTP/1.1 408") and '"timeout_error"' in answer


def test_guarded_metrics_and_schema_need_the_key(fake):
    for path in ("/metrics", "/openapi.json"):
        assert_openai_error(httpx.get(fake.url + path, timeout=10), 401)
        assert httpx.get(fake.url + path, headers=AUTH, timeout=10).status_code == 200
    assert "ssd_gateway_requests_in_flight" in httpx.get(fake.url + "/metrics", headers=AUTH, timeout=10).text
    assert httpx.get(fake.url + "/health", timeout=10).status_code == 200  # probes need no key


@pytest.mark.parametrize(("fields", "words"), [
    ({"prompt": "hi", "mode": 99}, "mode"),
    ({"chat": gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="wizard", content="hi")])}, "role"),
    ({"chat": gateway_pb2.ChatMessages()}, "no messages"),
    ({"prompt": "hi", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "hi", "stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"prompt": "hi", "logit_bias": {-3: 1.0}}, "logit_bias"),
    ({"prompt": "hi", "temperature": float("nan")}, "temperature"),
    ({"prompt": "hi", "logprobs": 99}, "logprobs"),
    ({"prompt": "hi", "top_k": -1}, "top_k"),
])
def test_grpc_refuses_what_http_refuses(fake, fields, words):
    with grpc.insecure_channel(fake.grpc_address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            gateway_pb2_grpc.GenerationStub(ch).Generate(gateway_pb2.GenerateRequest(max_tokens=2, **fields),
                                                         metadata=GRPC_AUTH, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details()


def test_grpc_deadline_and_size_limit(fake):
    with grpc.insecure_channel(fake.grpc_address) as ch:
        stub = gateway_pb2_grpc.GenerationStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(gateway_pb2.GenerateRequest(prompt="hi", max_tokens=100), metadata=GRPC_AUTH, timeout=0.5)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(gateway_pb2.GenerateRequest(prompt="x" * (5 << 20)), metadata=GRPC_AUTH, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        ok = stub.Generate(gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2,
                                                       mode=common_pb2.SPECULATION_MODE_AR), metadata=GRPC_AUTH,
                           timeout=30)
        assert ok.usage.completion_tokens == 2
