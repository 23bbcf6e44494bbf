"""The draft trusts no target: every bad Speculator.Session message gets a client error code at once, and a
normal request served meanwhile still gets speculation."""

import threading
import time

import grpc
import pytest

from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client, stream_chat

pytestmark = pytest.mark.model

CLIENT_CODES = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "NOT_FOUND"}
HELLO = draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="bad-peer", vocab_size=49152))
GOOD = draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 4])


def _round(**fields) -> draft_pb2.Round:  # noqa: ANN003
    return draft_pb2.Round(**{"num_speculative_tokens": 2, "prefills": [GOOD], **fields})


BAD_ROUNDS = {  # refused as a whole: the stream ends with the code
    "huge K": _round(num_speculative_tokens=10**6),
    "huge tree": _round(tree=draft_pb2.TreeShape(budget=10**6, depth=2, top_k=2)),
    "huge top-k": _round(tree=draft_pb2.TreeShape(budget=8, depth=2, top_k=10**6)),
    "huge fan-out": _round(ssd=draft_pb2.SsdOptions(fan_out_budget=10**6)),
    "too many sequences": _round(prefills=[draft_pb2.Prefill(seq_id=i, token_ids=[1]) for i in range(5000)]),
}
BAD_SEQUENCES = {  # refused alone: the round's errors name the sequence, the session goes on
    "token id 10^9": draft_pb2.Prefill(seq_id=2, token_ids=[1, 10**9]),
    "negative token id": draft_pb2.Prefill(seq_id=2, token_ids=[-1, 5]),
    "past the model length": draft_pb2.Prefill(seq_id=2, token_ids=[1] * 100_000),
    "NaN temperature": draft_pb2.Prefill(seq_id=2, token_ids=[1, 2], temperature=float("nan")),
}


def _session(address: str, requests: list[draft_pb2.SessionRequest]) -> tuple[list, grpc.StatusCode, float]:
    """(replies, final status, seconds) of one session sending `requests`."""
    started = time.monotonic()
    with grpc.insecure_channel(address) as ch:
        call = draft_pb2_grpc.SpeculatorStub(ch).Session(iter(requests), timeout=30)
        replies = []
        try:
            replies.extend(call)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
    return replies, code, time.monotonic() - started


def test_bad_session_messages_get_client_errors_while_others_speculate(stack):
    client = openai_client(stack.url, API_KEY)
    normal: list = []
    worker = threading.Thread(target=lambda: normal.append(stream_chat(client, "Count to twenty.", 32, "sd")))
    worker.start()
    seconds = {}
    for name, round_ in BAD_ROUNDS.items():
        replies, code, seconds[name] = _session(stack.draft_address, [HELLO, draft_pb2.SessionRequest(
            round_id=2, round=round_)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, name
        assert [r.WhichOneof("kind") for r in replies] == ["ready"], name
    for name, prefill in BAD_SEQUENCES.items():
        replies, code, seconds[name] = _session(stack.draft_address, [HELLO, draft_pb2.SessionRequest(
            round_id=2, round=_round(prefills=[GOOD, prefill]))])
        assert code == grpc.StatusCode.OK, name
        errors = replies[1].speculations.errors
        assert [(e.seq_id, e.code) for e in errors] == [(2, "INVALID_ARGUMENT")], name
        assert [item.seq_id for item in replies[1].speculations.items] == [1], name
    worker.join(240)
    text, usage = normal[0]
    assert text and usage["speculation"]["num_drafts"] > 0
    assert max(seconds.values()) < 10, seconds  # no minute-long stall (each took well under a second here)
