"""`ssd loadtest` on client- and bidi-streaming methods, against the real draft service (n-gram: no weights):
generated Speculator.Session streams from a -D JSON-lines file, in lockstep and ghz-style; call templates;
--proto / --protoset; a client-streaming method of a user's .proto; and record -> replay through the proxy."""

import argparse
import asyncio
import json
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_tools import protoc

from deploy.local import Child, free_port, spawn, stop_child, wait_healthy
from loadtest.call import compile_proto, resolve_call
from loadtest.cli import add_loadtest_arguments
from loadtest.data import CallContext, load_call_data
from loadtest.errors import LoadTestError
from loadtest.options import LoadOptions
from loadtest.record import record_streams
from loadtest.report import build_report
from loadtest.runner import run_load
from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from tests.loadtest.session_streams import session_stream, write_streams

SESSION = "ssd.v1.Speculator.Session"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Child:
    address = f"127.0.0.1:{free_port()}"
    child = spawn("draft", ["draft_service", "--draft", "ngram", "--address", address, "--threads", "1"],
                  address, None, tmp_path_factory.mktemp("stream-logs"))
    try:
        wait_healthy([child], timeout_s=60)
        yield child
    finally:
        stop_child(child)


@pytest.fixture
def streams_file(tmp_path) -> Path:
    return write_streams(tmp_path / "sessions.jsonl", [session_stream(7, [1, 2, 3, 1, 2, 3, 1, 2], 5),
                                                       session_stream(9, [5, 6, 5, 6], 3)])


def _report(**options) -> dict:  # noqa: ANN003
    opts = LoadOptions(is_insecure=True, **options)
    return build_report(asyncio.run(run_load(opts)), opts)


def test_generated_session_streams_are_valid_rounds(draft: Child) -> None:
    """The generated data drives real rounds: every Round gets Speculations without errors."""
    requests = [json_message(m) for m in session_stream(7, [1, 2, 3, 1, 2, 3, 1, 2], 5)]
    with grpc.insecure_channel(draft.address) as channel:
        replies = list(draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests), timeout=20))
    assert [r.WhichOneof("kind") for r in replies] == ["ready"] + ["speculations"] * 6
    assert all(not r.speculations.errors for r in replies[1:])
    assert any(r.speculations.items[0].token_ids for r in replies[1:])  # the n-gram draft proposed something


def json_message(value: dict) -> draft_pb2.SessionRequest:
    from google.protobuf import json_format

    return json_format.ParseDict(value, draft_pb2.SessionRequest())


def test_lockstep_session_streams_report_round_trips(draft: Child, streams_file: Path) -> None:
    report = _report(host=draft.address, call=SESSION, data_file=streams_file, concurrency=2, total=4,
                     lockstep_field="round_id")
    assert report["statusCodeDistribution"] == {"OK": 4}, report["errorDistribution"]
    stream = report["streaming"]
    # calls 0 and 2 replay line 1 (hello + 6 rounds + release), calls 1 and 3 line 2 (hello + 4 rounds + release)
    assert stream["messagesSent"] == 2 * 8 + 2 * 6
    assert stream["messagesReceived"] == stream["roundTrip"]["count"] == 2 * 7 + 2 * 5
    assert 0 < stream["roundTrip"]["fastest"] <= stream["roundTrip"]["slowest"] <= report["slowest"]
    assert report["options"]["lockstep-field"] == "round_id"


def test_ghz_style_bidi_sends_while_reading(draft: Child, streams_file: Path, capsys) -> None:  # noqa: ANN001
    parser = argparse.ArgumentParser()
    add_loadtest_arguments(parser)
    args = parser.parse_args([draft.address, "--insecure", "--call", SESSION, "-D", str(streams_file), "-c", "2",
                              "-z", "1s", "-O", "json"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["count"] > 2 and report["statusCodeDistribution"] == {"OK": report["count"]}
    assert report["streaming"]["messagesReceived"] > 0 and report["streaming"]["roundTrip"]["count"] == 0
    assert report["options"]["data-file"] == str(streams_file)


def test_call_templates_render_per_call(draft: Child, tmp_path: Path) -> None:
    opts = LoadOptions(host=draft.address, call=SESSION, is_insecure=True, data=json.dumps(
        [{"round_id": 1, "hello": {"vocab_size": 10}}, {"release": {"seq_ids": [0]}}]).replace(
        '"seq_ids": [0]', '"seq_ids": [{{.RequestNumber}}, {{randomInt 40 41}}]'))
    target = resolve_call(opts, None)
    data = load_call_data(opts, target)
    messages = list(data.messages(12, CallContext("g0c0", 12, "u")))
    assert [m.WhichOneof("kind") for m in messages] == ["hello", "release"]
    assert list(messages[1].release.seq_ids) == [12, 40]
    bad = LoadOptions(host=draft.address, call=SESSION, is_insecure=True, data='{"round_id": {{.Nope}}}')
    with pytest.raises(LoadTestError, match="unknown call template field"):
        load_call_data(bad, target)


def test_unary_round_robin_over_a_json_array(draft: Child) -> None:
    opts = LoadOptions(host=draft.address, call="ssd.v1.Speculator.GetInfo", is_insecure=True, data="[{}, {}]")
    target = resolve_call(opts, None)
    assert len(list(load_call_data(opts, target).messages(3, CallContext("g0c0", 3, "u")))) == 1


def test_proto_and_protoset_resolve_the_method(draft: Child, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(REPO)  # the protos' imports are rooted at protos/, ghz's -i
    report = _report(host=draft.address, call="ssd.v1.Speculator.GetInfo", total=3, concurrency=1,
                     proto=Path("ssd/v1/draft.proto"), import_paths=(Path("protos"),))
    assert report["statusCodeDistribution"] == {"OK": 3}
    protoset = tmp_path / "draft.protoset"
    assert protoc.main(["protoc", f"-I{REPO / 'protos'}", "--include_imports", f"--descriptor_set_out={protoset}",
                        "ssd/v1/draft.proto"]) == 0
    monkeypatch.chdir(tmp_path)
    report = _report(host=draft.address, call=SESSION, protoset=protoset, total=2, concurrency=1,
                     data=json.dumps(session_stream(3, [1, 2, 1, 2], 2)), lockstep_field="round_id")
    assert report["statusCodeDistribution"] == {"OK": 2}, report["errorDistribution"]
    with pytest.raises(LoadTestError, match="defines no service"):
        _report(host=draft.address, call="x.Nope.Call", protoset=protoset, total=1)


SUM_PROTO = """syntax = "proto3";
package loadtest.fake;
message Number { int64 value = 1; }
service Adder { rpc Sum(stream Number) returns (Number); }
"""


def test_client_streaming_of_a_users_proto(tmp_path: Path) -> None:
    """A tiny client-streaming servicer built from the same .proto: every call's stream is summed."""
    proto = tmp_path / "adder.proto"
    proto.write_text(SUM_PROTO)
    pool = compile_proto(proto, ())
    from google.protobuf import message_factory

    number = message_factory.GetMessageClass(pool.FindMessageTypeByName("loadtest.fake.Number"))
    sums: list[int] = []

    def add(requests, context):  # noqa: ANN001, ANN202
        sums.append(sum(r.value for r in requests))
        return number(value=sums[-1])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.stream_unary_rpc_method_handler(add, request_deserializer=number.FromString,
                                                   response_serializer=number.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("loadtest.fake.Adder", {"Sum": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        report = _report(host=f"127.0.0.1:{port}", call="loadtest.fake.Adder.Sum", proto=proto, total=5,
                         concurrency=2, data='[{"value": {{.RequestNumber}}}, {"value": 100}]')
    finally:
        server.stop(0)
    assert report["statusCodeDistribution"] == {"OK": 5}
    assert sorted(sums) == [100, 101, 102, 103, 104]
    assert report["streaming"]["messagesSent"] == 10 and report["streaming"]["messagesReceived"] == 5


def test_record_then_replay(draft: Child, tmp_path: Path, streams_file: Path) -> None:
    """Streams sent through the recording proxy come out as -D lines that replay against the draft."""
    listen = f"127.0.0.1:{free_port()}"
    recorded = tmp_path / "recorded.jsonl"
    opts = LoadOptions(host=draft.address, call=SESSION, is_insecure=True)
    result: list[int] = []
    proxy = threading.Thread(target=lambda: result.append(asyncio.run(record_streams(opts, listen, recorded, 2))))
    proxy.start()
    sent = [json.loads(line) for line in streams_file.read_text().splitlines()]
    with grpc.insecure_channel(listen) as channel:
        grpc.channel_ready_future(channel).result(timeout=20)
        info = draft_pb2_grpc.SpeculatorStub(channel).GetInfo(draft_pb2.DraftInfoRequest(), timeout=10)
        assert info.draft_name == "ngram"  # unary methods are forwarded too
        for stream in sent:
            requests = [json_message(m) for m in stream]
            requests[0].hello.transports.append(2)  # shared memory offered: the proxy keeps INLINE only
            replies = list(draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests), timeout=20))
            assert replies[0].ready.transport == 1 and len(replies) == len(stream) - 1
    proxy.join(timeout=30)
    assert result == [2]
    lines = [json.loads(line) for line in recorded.read_text().splitlines()]
    assert [[int(m.get("round_id", 0)) for m in line] for line in lines] == [[m.get("round_id", 0) for m in s]
                                                                             for s in sent]  # uint64: JSON strings
    assert lines[0][0]["hello"]["transports"] == ["TENSOR_TRANSPORT_INLINE"]
    report = _report(host=draft.address, call=SESSION, data_file=recorded, total=2, concurrency=1,
                     lockstep_field="round_id")
    assert report["statusCodeDistribution"] == {"OK": 2}


def test_lockstep_needs_a_bidi_call_and_the_field(draft: Child) -> None:
    with pytest.raises(LoadTestError, match="needs a bidi-streaming call"):
        _report(host=draft.address, call="ssd.v1.Speculator.GetInfo", total=1, lockstep_field="round_id")
    with pytest.raises(LoadTestError, match="has no such field"):
        _report(host=draft.address, call=SESSION, total=1, lockstep_field="nope")


def test_the_proxy_passes_on_the_upstreams_status(tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    opts = LoadOptions(host=f"127.0.0.1:{free_port()}", call=SESSION, is_insecure=True, timeout_s=2.0)  # nobody there
    done: list[int] = []
    proxy = threading.Thread(target=lambda: done.append(asyncio.run(record_streams(opts, listen, tmp_path / "r", 1))),
                             daemon=True)
    proxy.start()
    with grpc.insecure_channel(listen) as channel:
        grpc.channel_ready_future(channel).result(timeout=20)
        with pytest.raises(grpc.RpcError) as info:
            draft_pb2_grpc.SpeculatorStub(channel).GetInfo(draft_pb2.DraftInfoRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        requests = [json_message(m) for m in session_stream(1, [1, 2], 1)]
        with pytest.raises(grpc.RpcError) as info:
            list(draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
