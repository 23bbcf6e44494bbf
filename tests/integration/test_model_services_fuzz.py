"""hypothesis over the model services' gRPC APIs, real processes (a tiny float32 target and a tiny EAGLE-3 head
served by the draft service): `Verifier.Generate` with any prompt ids and sampling values, and
`Speculator.Session` with sequences of valid and invalid messages (rounds of random sizes, prefills and outcomes
with ids out of range, huge counts, bad features, releases, messages of no kind). Every answer is OK or a
client status, never INTERNAL / UNKNOWN, and each service keeps serving: a normal call afterwards succeeds.
Bounded example counts by default; `make test-slow` runs the long profile. `-s` prints the counts."""

import math
import sys
from collections import Counter

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.local import free_port, start_stack, stop_stack
from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from tests.integration.helpers import stack_config

pytestmark = pytest.mark.model

NUM_EXAMPLES, NUM_EXAMPLES_SLOW = 60, 1000
CLIENT_CODES = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                "DEADLINE_EXCEEDED"}
CODES: dict[str, Counter] = {"target": Counter(), "draft": Counter(), "draft sequence errors": Counter()}
_SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True}

int32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 40))
int64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 2000))
floats32 = st.one_of(st.floats(width=32), st.floats(-3, 3, width=32))


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """(target address, draft address, vocab size, feature width) of a real stack."""
    from ssd.model_config import load_model_config
    from tests.speculation.test_eagle3_sd import tiny_target_and_head

    target, head = tiny_target_and_head(tmp_path_factory)
    config = stack_config(model=str(target), draft=str(head), dtype="float32", k=3, http_port=free_port(),
                         grpc_port=free_port(), log_dir=tmp_path_factory.mktemp("logs-services-fuzz"))
    stack = start_stack(config, timeout_s=180)
    tc = load_model_config(target)
    with grpc.insecure_channel(stack.draft_address) as ch:
        info = draft_pb2_grpc.SpeculatorStub(ch).GetInfo(draft_pb2.DraftInfoRequest(), timeout=10)
    try:
        yield stack.target_addresses[0], stack.draft_address, tc.vocab_size, len(info.feature_layers) * tc.hidden_size
    finally:
        stop_stack(stack)
        sys.stdout.write(f"\nmodel services fuzz: {', '.join(f'{k}: {dict(v)}' for k, v in CODES.items())}\n")


# -- Verifier.Generate -----------------------------------------------------------------------------------------
@st.composite
def generate_requests(draw: st.DrawFn, vocab: int) -> target_pb2.VerifierGenerateRequest:
    ids = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, vocab - 1))
    params = common_pb2.SamplingParams(
        temperature=draw(floats32), top_p=draw(floats32), top_k=draw(int32), max_tokens=draw(int32),
        stop_token_ids=draw(st.lists(ids, max_size=3)), ignore_eos=draw(st.booleans()),
        presence_penalty=draw(floats32), frequency_penalty=draw(floats32), repetition_penalty=draw(floats32),
        min_p=draw(floats32), min_tokens=draw(int32), logit_bias=draw(st.dictionaries(ids, floats32, max_size=2)))
    for name, values in (("seed", int64), ("draft_temperature", floats32), ("logprobs", int32),
                         ("prompt_logprobs", int32)):
        if draw(st.booleans()):
            setattr(params, name, draw(values))
    return target_pb2.VerifierGenerateRequest(request_id=draw(st.text(max_size=8)), params=params,
                                              prompt_token_ids=draw(st.lists(ids, max_size=6)),
                                              mode=draw(st.one_of(st.integers(0, 4), int32)))


def plausible_generate(req: target_pb2.VerifierGenerateRequest, vocab: int) -> target_pb2.VerifierGenerateRequest:
    """Half the examples are made valid, so generation runs too."""
    out = target_pb2.VerifierGenerateRequest()
    out.CopyFrom(req)
    p = out.params
    p.temperature = 0.0 if not math.isfinite(p.temperature) else min(abs(p.temperature), 2.0)
    p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty = 1.0, 0.0, 0, 0, 1
    p.top_k, p.min_tokens, p.max_tokens = abs(p.top_k) % 50, 0, 1 + abs(p.max_tokens) % 6
    for name in ("draft_temperature", "logprobs", "prompt_logprobs"):
        p.ClearField(name)
    del p.stop_token_ids[:]
    p.logit_bias.clear()
    ids = [abs(t) % vocab for t in out.prompt_token_ids] or [1]
    del out.prompt_token_ids[:]
    out.prompt_token_ids.extend(ids)
    out.mode = out.mode % 5
    return out


def generate(address: str, req: target_pb2.VerifierGenerateRequest) -> str:
    with grpc.insecure_channel(address) as ch:
        try:
            for _ in target_pb2_grpc.VerifierStub(ch).Generate(req, timeout=60):
                pass
            return "OK"
        except grpc.RpcError as e:
            assert e.code().name in CLIENT_CODES, f"{e.code().name}: {e.details()} for {req}"
            return e.code().name


def _fuzz_target(services, data) -> None:  # noqa: ANN001
    address, _, vocab, _ = services
    req = data.draw(generate_requests(vocab))
    if data.draw(st.booleans()):
        req = plausible_generate(req, vocab)
    CODES["target"][generate(address, req)] += 1


@settings(max_examples=NUM_EXAMPLES, **_SETTINGS)
@given(data=st.data())
def test_no_generate_request_is_a_server_error(services, data):
    _fuzz_target(services, data)


@pytest.mark.slow
@settings(max_examples=NUM_EXAMPLES_SLOW, **_SETTINGS)
@given(data=st.data())
def test_no_generate_request_is_a_server_error_long(services, data):
    _fuzz_target(services, data)


# -- Speculator.Session -----------------------------------------------------------------------------------------
@st.composite
def features(draw: st.DrawFn, width: int) -> common_pb2.Tensor:
    rows = draw(st.integers(0, 6))
    cols = draw(st.sampled_from([width, width, width + 1, 0, 3]))
    dtype = draw(st.sampled_from(["float32", "float32", "bfloat16", "int8", ""]))
    size = rows * cols * (2 if dtype == "bfloat16" else 4) + draw(st.sampled_from([0, 0, 1, -1]))
    shape = draw(st.sampled_from([[rows, cols], [rows, cols], [rows], [rows, cols, 1]]))
    if draw(st.integers(0, 5)) == 0:  # a handle that opens nothing
        return common_pb2.Tensor(dtype=dtype, shape=shape, handle=common_pb2.TensorHandle(
            transport=draw(st.integers(0, 4)), handle=draw(st.binary(max_size=24)), offset=draw(st.integers(0, 2**40))))
    return common_pb2.Tensor(dtype=dtype, shape=shape, inline_bytes=b"\0" * max(0, size))


@st.composite
def session_messages(draw: st.DrawFn, vocab: int, width: int) -> list[draft_pb2.SessionRequest]:
    seq_ids = st.one_of(st.integers(1, 4), st.integers(0, 2**64 - 1))
    ids = st.one_of(st.integers(0, vocab - 1), st.integers(-(2**31), 2**31 - 1))
    tokens = st.one_of(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8), st.lists(ids, max_size=8))
    maybe_features = st.one_of(st.none(), features(width))

    def prefill() -> draft_pb2.Prefill:
        p = draft_pb2.Prefill(seq_id=draw(seq_ids), token_ids=draw(tokens), temperature=draw(floats32),
                              seed=draw(int64), ssd=draw(st.booleans()), features_start=draw(int32))
        if (f := draw(maybe_features)) is not None:
            p.features.CopyFrom(f)
        if draw(st.booleans()):
            p.time_left_ms = draw(int64)
        return p

    def outcome() -> draft_pb2.Outcome:
        o = draft_pb2.Outcome(seq_id=draw(seq_ids), num_committed_before=draw(int32), new_token_ids=draw(tokens),
                              num_accepted=draw(int32), bonus_token=draw(ids), features_start=draw(int32))
        if (f := draw(maybe_features)) is not None:
            o.features.CopyFrom(f)
        return o

    out = [draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(
        target_id="fuzz", vocab_size=draw(st.sampled_from([vocab, vocab, 0, vocab + 1]))))]
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["round", "round", "round", "release", "none"]))
        msg = draft_pb2.SessionRequest(round_id=2 + i)
        if kind == "round":
            r = msg.round
            r.num_speculative_tokens = draw(st.one_of(st.integers(0, 5), int32))
            if draw(st.booleans()):
                r.tree.CopyFrom(draft_pb2.TreeShape(budget=draw(int32), depth=draw(int32), top_k=draw(int32)))
            if draw(st.booleans()):
                r.ssd.fan_out_budget = draw(int32)
            r.prefills.extend(prefill() for _ in range(draw(st.integers(0, 3))))
            r.outcomes.extend(outcome() for _ in range(draw(st.integers(0, 2))))
        elif kind == "release":
            msg.release.seq_ids.extend(draw(st.lists(seq_ids, max_size=3)))
        out.append(msg)
    return out


def run_session(address: str, messages: list[draft_pb2.SessionRequest]) -> tuple[str, list]:
    with grpc.insecure_channel(address) as ch:
        replies = []
        try:
            replies.extend(draft_pb2_grpc.SpeculatorStub(ch).Session(iter(messages), timeout=60))
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
            assert code in CLIENT_CODES, f"{code}: {e.details()} for {messages}"
    return code, replies


def _fuzz_draft(services, data) -> None:  # noqa: ANN001
    _, address, vocab, width = services
    code, replies = run_session(address, data.draw(session_messages(vocab, width)))
    CODES["draft"][code] += 1
    for reply in replies:
        errors = list(reply.speculations.errors) + ([reply.error] if reply.HasField("error") else [])
        for e in errors:
            assert e.code in CLIENT_CODES, e
            CODES["draft sequence errors"][e.code] += 1


@settings(max_examples=NUM_EXAMPLES, **_SETTINGS)
@given(data=st.data())
def test_no_session_message_is_a_server_error(services, data):
    _fuzz_draft(services, data)


@pytest.mark.slow
@settings(max_examples=NUM_EXAMPLES_SLOW, **_SETTINGS)
@given(data=st.data())
def test_no_session_message_is_a_server_error_long(services, data):
    _fuzz_draft(services, data)


def test_both_services_keep_serving(services):
    """After the fuzzing: a normal SD request is served with drafts, and a normal session round is answered."""
    target, draft, vocab, width = services
    with grpc.insecure_channel(target) as ch:
        last = list(target_pb2_grpc.VerifierStub(ch).Generate(target_pb2.VerifierGenerateRequest(
            prompt_token_ids=[1, 2, 3, 4, 5], mode=common_pb2.SPECULATION_MODE_SD,
            params=common_pb2.SamplingParams(max_tokens=12, ignore_eos=True)), timeout=120))[-1]
    assert last.finish_reason and last.spec.num_drafts > 0
    good = draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 4], features=common_pb2.Tensor(
        dtype="float32", shape=[3, width], inline_bytes=b"\0" * (3 * width * 4)))
    code, replies = run_session(draft, [
        draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="after", vocab_size=vocab)),
        draft_pb2.SessionRequest(round_id=2, round=draft_pb2.Round(num_speculative_tokens=3, prefills=[good]))])
    assert code == "OK" and [i.seq_id for i in replies[-1].speculations.items] == [1]
    assert not replies[-1].speculations.errors and len(replies[-1].speculations.items[0].token_ids) == 3
