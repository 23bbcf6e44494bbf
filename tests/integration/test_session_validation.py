"""The draft trusts no target: every bad Speculator.Session message gets a client error code within 1 s (the
round is screened on the draft's event loop, before it waits behind model work), and a normal request served
meanwhile still gets speculation. Run with `-s` to print each message's seconds."""

import queue
import sys
import threading
import time

import grpc
import pytest

from deploy.local import free_port, start_stack, stop_stack
from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client, stack_config, stream_chat

pytestmark = pytest.mark.model

BOUND_S = 1.0  # the bound for a bad message's answer
HELLO = draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="bad-peer", vocab_size=49152))
GOOD = draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 4])


def _round(**fields) -> draft_pb2.Round:  # noqa: ANN003
    return draft_pb2.Round(**{"num_speculative_tokens": 2, "prefills": [GOOD], **fields})


BAD_ROUNDS = {  # refused as a whole: the stream ends with the code
    "huge K": _round(num_speculative_tokens=10**6),
    "negative K": _round(num_speculative_tokens=-1),
    "huge tree": _round(tree=draft_pb2.TreeShape(budget=10**6, depth=2, top_k=2)),
    "huge top-k": _round(tree=draft_pb2.TreeShape(budget=8, depth=2, top_k=10**6)),
    "bad tree depth": _round(tree=draft_pb2.TreeShape(budget=8, depth=10**6, top_k=2)),
    "zero tree depth": _round(tree=draft_pb2.TreeShape(budget=8, depth=0, top_k=2)),
    "huge fan-out": _round(ssd=draft_pb2.SsdOptions(fan_out_budget=10**6)),
    "too many sequences": _round(prefills=[draft_pb2.Prefill(seq_id=i, token_ids=[1]) for i in range(5000)]),
}
BAD_SEQUENCES = {  # refused alone: the round's errors name the sequence, the session goes on
    "token id 10^9": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 10**9]), "INVALID_ARGUMENT"),
    "negative token id": (draft_pb2.Prefill(seq_id=2, token_ids=[-1, 5]), "INVALID_ARGUMENT"),
    "past the model length": (draft_pb2.Prefill(seq_id=2, token_ids=[1] * 100_000), "INVALID_ARGUMENT"),
    "NaN temperature": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2], temperature=float("nan")), "INVALID_ARGUMENT"),
    "empty prefill": (draft_pb2.Prefill(seq_id=2), "INVALID_ARGUMENT"),
    "deadline passed": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2], time_left_ms=0), "DEADLINE_EXCEEDED"),
    "outcome for an unknown sequence": (draft_pb2.Outcome(seq_id=2, num_committed_before=0, new_token_ids=[1]),
                                        "NOT_FOUND"),
    "outcome past the held tokens": (draft_pb2.Outcome(seq_id=3, num_committed_before=99, new_token_ids=[1]),
                                     "INVALID_ARGUMENT"),
    "too long an outcome": (draft_pb2.Outcome(seq_id=3, num_committed_before=4, new_token_ids=[1] * 9000),
                            "INVALID_ARGUMENT"),
    "outcome with id 10^9": (draft_pb2.Outcome(seq_id=3, num_committed_before=4, new_token_ids=[10**9]),
                             "INVALID_ARGUMENT"),
}
HELD = draft_pb2.Prefill(seq_id=3, token_ids=[5, 6, 7, 8])  # a sequence the bad outcomes name


def timed_session(address: str, hello: draft_pb2.SessionRequest, setup: list[draft_pb2.Round],
                  bad: draft_pb2.Round) -> tuple[list, grpc.StatusCode, float]:
    """(replies, final status, seconds from sending `bad` to its answer or the stream's end) of one session:
    Hello, the `setup` rounds (each answered before the next is sent), then `bad`."""
    replies, answered, sent_at = [], queue.Queue(), []

    def requests():  # noqa: ANN202
        yield hello
        answered.get(timeout=30)
        for i, r in enumerate([*setup, bad]):
            if i == len(setup):
                sent_at.append(time.monotonic())
            yield draft_pb2.SessionRequest(round_id=2 + i, round=r)
            answered.get(timeout=30)

    with grpc.insecure_channel(address) as ch:
        call = draft_pb2_grpc.SpeculatorStub(ch).Session(requests(), timeout=30)
        try:
            for reply in call:
                replies.append(reply)
                answered.put(None)
                if len(replies) == 2 + len(setup):
                    break
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        seconds = time.monotonic() - sent_at[0] if sent_at else float("inf")
        call.cancel()
    return replies, code, seconds


def _print(title: str, seconds: dict[str, float]) -> None:
    sys.stdout.write(f"\n{title}: " + ", ".join(f"{k}: {v * 1000:.1f} ms" for k, v in seconds.items()) + "\n")


def test_bad_session_messages_get_client_errors_within_a_second_while_others_speculate(stack):
    client = openai_client(stack.url, API_KEY)
    normal: list = []
    worker = threading.Thread(target=lambda: normal.append(stream_chat(client, "Count to twenty.", 32, "sd")))
    worker.start()
    seconds = {}
    for name, round_ in BAD_ROUNDS.items():
        replies, code, seconds[name] = timed_session(stack.draft_address, HELLO, [], round_)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, name
        assert [r.WhichOneof("kind") for r in replies] == ["ready"], name
    for name, (msg, expected) in BAD_SEQUENCES.items():
        bad = _round()
        (bad.prefills if isinstance(msg, draft_pb2.Prefill) else bad.outcomes).append(msg)
        setup = [_round(prefills=[HELD])] if isinstance(msg, draft_pb2.Outcome) else []
        replies, code, seconds[name] = timed_session(stack.draft_address, HELLO, setup, bad)
        assert code == grpc.StatusCode.OK, name
        errors = replies[-1].speculations.errors
        assert [(e.seq_id, e.code) for e in errors] == [(msg.seq_id, expected)], name
        assert [item.seq_id for item in replies[-1].speculations.items] == [1], name
    worker.join(240)
    _print("bad Session messages, seconds to their answer", seconds)
    text, usage = normal[0]
    assert text and usage["speculation"]["num_drafts"] > 0
    assert max(seconds.values()) < BOUND_S, seconds


@pytest.fixture(scope="module")
def eagle_stack(tmp_path_factory):
    """A tiny target with a tiny EAGLE-3 head served by the draft service (it needs target features)."""
    from tests.speculation.test_eagle3_sd import tiny_target_and_head

    target, head = tiny_target_and_head(tmp_path_factory)
    config = stack_config(model=str(target), draft=str(head), dtype="float32", k=3, http_port=free_port(),
                         grpc_port=free_port(), log_dir=tmp_path_factory.mktemp("logs-eagle-validation"))
    stack = start_stack(config, timeout_s=180)
    yield stack, target
    stop_stack(stack)


def test_bad_target_features_get_client_errors_within_a_second(eagle_stack):
    from ssd.model_config import load_model_config

    stack, target = eagle_stack
    tc = load_model_config(target)
    with grpc.insecure_channel(stack.draft_address) as ch:
        layers = draft_pb2_grpc.SpeculatorStub(ch).GetInfo(draft_pb2.DraftInfoRequest(), timeout=10).feature_layers
    width = len(layers) * tc.hidden_size
    hello = draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="bad-peer", vocab_size=tc.vocab_size))

    def features(rows: int, cols: int, num_bytes: int | None = None) -> common_pb2.Tensor:
        size = rows * cols * 4 if num_bytes is None else num_bytes
        return common_pb2.Tensor(dtype="float32", shape=[rows, cols], inline_bytes=b"\0" * size)

    good = draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 4], features=features(3, width))
    bad_features = {
        "features of a wrong width": features(3, width + 1),
        "features of a wrong row count": features(9, width),
        "features of a wrong byte count": features(3, width, num_bytes=12),
        "a bad tensor handle": common_pb2.Tensor(dtype="float32", shape=[3, width], handle=common_pb2.TensorHandle(
            transport=common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY, handle=b"ssd-0000000000000000", offset=0)),
    }
    seconds = {}
    for name, tensor in bad_features.items():
        bad = draft_pb2.Round(num_speculative_tokens=2, prefills=[
            good, draft_pb2.Prefill(seq_id=2, token_ids=[1, 2, 3, 4], features=tensor)])
        replies, code, seconds[name] = timed_session(stack.draft_address, hello, [], bad)
        assert code == grpc.StatusCode.OK, name
        errors = replies[-1].speculations.errors
        assert [(e.seq_id, e.code) for e in errors] == [(2, "INVALID_ARGUMENT")], (name, errors)
        assert [item.seq_id for item in replies[-1].speculations.items] == [1], name
    _print("bad target features, seconds to their answer", seconds)
    assert max(seconds.values()) < BOUND_S, seconds
