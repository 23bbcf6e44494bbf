"""Bad input gets the right status and a clear message, and the services keep serving right after."""

import socket

import grpc
import httpx
import pytest

from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client, stream_chat

pytestmark = pytest.mark.model

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = "/v1/chat/completions"
GOOD = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _still_serving(stack) -> None:  # noqa: ANN001
    text, usage = stream_chat(openai_client(stack.url, API_KEY), "Say yes.", 3)
    assert usage["completion_tokens"] > 0


@pytest.mark.parametrize(("body", "headers", "status", "words"), [
    (b"{not json", AUTH, 400, "invalid request body"),
    ({**GOOD, "temperature": "hot"}, AUTH, 400, "temperature"),
    ({**GOOD, "messages": "hello"}, AUTH, 400, "messages"),
    ({**GOOD, "model": "gpt-17"}, AUTH, 404, "does not exist"),
    ({**GOOD, "max_tokens": -5}, AUTH, 400, "max_tokens"),
    ({**GOOD, "messages": [{"role": "user", "content": "word " * 9000}]}, AUTH, 400, "tokens"),
    (GOOD, {}, 401, "missing API key"),
    (GOOD, {"Authorization": "Bearer wrong"}, 401, "invalid API key"),
    ({**GOOD, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}, AUTH, 413, "bytes"),
])
def test_bad_http_input(stack, body, headers, status, words):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(stack.url + CHAT, headers={"Content-Type": "application/json", **headers}, timeout=60, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["type"]
    _still_serving(stack)


def test_garbage_bytes_on_grpc_ports(stack):
    for child in stack.children:
        host, port = child.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
            s.settimeout(5)
            try:
                s.recv(1024)  # the server answers with an HTTP/2 GOAWAY or closes
            except (TimeoutError, ConnectionResetError):
                pass
    _still_serving(stack)


def test_unknown_sequence_on_the_session_is_an_error_not_a_crash(stack):
    with grpc.insecure_channel(stack.draft_address) as ch:
        stub = draft_pb2_grpc.SpeculatorStub(ch)
        requests = [
            draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="test", vocab_size=49152)),
            draft_pb2.SessionRequest(round_id=2, round=draft_pb2.Round(num_speculative_tokens=2, outcomes=[
                draft_pb2.Outcome(seq_id=999, num_committed_before=3, new_token_ids=[5], num_accepted=0)])),
            draft_pb2.SessionRequest(round_id=3, round=draft_pb2.Round(num_speculative_tokens=2, prefills=[
                draft_pb2.Prefill(seq_id=7, token_ids=[1, 2, 3, 4])])),
            draft_pb2.SessionRequest(release=draft_pb2.Release(seq_ids=[7])),
        ]
        replies = list(stub.Session(iter(requests), timeout=30))
    assert replies[0].WhichOneof("kind") == "ready"
    errors = replies[1].speculations.errors
    assert replies[1].round_id == 2 and errors[0].code == "NOT_FOUND" and "unknown sequence id 999" in errors[0].message
    assert replies[2].round_id == 3 and len(replies[2].speculations.items[0].token_ids) == 2
    _still_serving(stack)


def test_grpc_api_errors(stack):
    from protos.ssd.v1 import gateway_pb2, gateway_pb2_grpc

    with grpc.insecure_channel(stack.grpc_address) as ch:
        stub = gateway_pb2_grpc.GenerationStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        md = (("authorization", f"Bearer {API_KEY}"),)
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(gateway_pb2.GenerateRequest(prompt="hi", max_tokens=-1), metadata=md, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Generate(gateway_pb2.GenerateRequest(prompt="hi", model="nope"), metadata=md, timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        ok = stub.Generate(gateway_pb2.GenerateRequest(prompt="hi", max_tokens=2), metadata=md, timeout=60)
        assert ok.usage.completion_tokens > 0
