"""hypothesis over the public Generation gRPC API of a real gateway process (fake fast target): valid and invalid
GenerateRequests (any int32 / float values, unknown modes and roles, empty chats, out-of-vocabulary ids) end OK
or with a client status, never INTERNAL / UNKNOWN. The fake target raises on anything the gateway should
have refused. Bounded example counts by default; `make test-slow` runs the long profile."""

import math
from collections import Counter

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.ssd.v1 import gateway_pb2, gateway_pb2_grpc
from tests.integration.gateway_stack import API_KEY, fake_stack

NUM_EXAMPLES, NUM_EXAMPLES_SLOW = 150, 3000
CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE}
CODES: Counter[str] = Counter()

int32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 50))
floats32 = st.one_of(st.floats(width=32), st.floats(-3, 3, width=32))
token_ids = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 49151))
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
roles = st.one_of(st.sampled_from(["system", "user", "assistant", "developer", "tool"]), text)
messages = st.lists(st.builds(gateway_pb2.ChatMessage, role=roles, content=text), max_size=3)


@st.composite
def requests(draw: st.DrawFn) -> gateway_pb2.GenerateRequest:
    req = gateway_pb2.GenerateRequest(
        model=draw(st.sampled_from(["", "", "fake-model", "other"])), temperature=draw(floats32),
        top_p=draw(floats32), top_k=draw(int32), max_tokens=draw(st.one_of(int32, st.integers(0, 8))),
        stop=draw(st.lists(text, max_size=2)), mode=draw(st.one_of(st.integers(0, 4), int32)),
        presence_penalty=draw(floats32), frequency_penalty=draw(floats32), repetition_penalty=draw(floats32),
        min_p=draw(floats32), min_tokens=draw(int32), stop_token_ids=draw(st.lists(token_ids, max_size=3)),
        logit_bias=draw(st.dictionaries(token_ids, floats32, max_size=2)),
        include_stop_str_in_output=draw(st.booleans()))
    if draw(st.booleans()):
        req.prompt = draw(text)
    elif draw(st.booleans()):
        req.chat.messages.extend(draw(messages))
    for field, values in (("seed", st.integers(-(2**63), 2**63 - 1)), ("logprobs", int32),
                          ("prompt_logprobs", int32), ("truncate_prompt_tokens", int32)):
        if draw(st.booleans()):
            setattr(req, field, draw(values))
    return req


def plausible(req: gateway_pb2.GenerateRequest) -> gateway_pb2.GenerateRequest:
    """Half the examples are made valid, so generation runs too (not only refusals)."""
    out = gateway_pb2.GenerateRequest()
    out.CopyFrom(req)
    out.temperature = 0.0 if not math.isfinite(req.temperature) else min(abs(req.temperature), 2.0)
    out.top_p, out.min_p, out.presence_penalty, out.frequency_penalty, out.repetition_penalty = 1.0, 0.0, 0, 0, 1
    out.top_k, out.min_tokens, out.max_tokens = abs(req.top_k) % 50, 0, abs(req.max_tokens) % 8
    out.mode, out.model = req.mode % 5, ""
    del out.stop_token_ids[:]
    out.logit_bias.clear()
    for field in ("logprobs", "prompt_logprobs", "truncate_prompt_tokens"):
        out.ClearField(field)
    if out.WhichOneof("input") is None or (out.HasField("chat") and not out.chat.messages):
        out.prompt = "hi"
    for m in out.chat.messages:
        m.role = "user"
    return out


@pytest.fixture(scope="module")
def stub(tmp_path_factory, default_model_path):  # noqa: ANN001, ANN201
    with fake_stack(tmp_path_factory.mktemp("fake-grpc-fuzz"), default_model_path, num_tokens=2,
                    token_delay_s=0.001) as s, grpc.insecure_channel(s.grpc_address) as channel:
        yield gateway_pb2_grpc.GenerationStub(channel)
    print(f"\ngrpc fuzz: {sum(CODES.values())} calls, codes {dict(sorted(CODES.items()))}")


def call(stub: gateway_pb2_grpc.GenerationStub, req: gateway_pb2.GenerateRequest, is_stream: bool) -> None:
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    try:
        if is_stream:
            for _ in stub.GenerateStream(req, metadata=metadata, timeout=60):
                pass
        else:
            stub.Generate(req, metadata=metadata, timeout=60)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
        assert code in CLIENT_CODES, f"{code.name}: {e.details()} for {req}"
    CODES[code.name] += 1


_SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True}


@settings(max_examples=NUM_EXAMPLES, **_SETTINGS)
@given(req=requests(), is_valid=st.booleans(), is_stream=st.booleans())
def test_no_request_is_a_server_error(stub, req, is_valid, is_stream):
    call(stub, plausible(req) if is_valid else req, is_stream)


@pytest.mark.slow
@settings(max_examples=NUM_EXAMPLES_SLOW, **_SETTINGS)
@given(req=requests(), is_valid=st.booleans(), is_stream=st.booleans())
def test_no_request_is_a_server_error_long(stub, req, is_valid, is_stream):
    call(stub, plausible(req) if is_valid else req, is_stream)
