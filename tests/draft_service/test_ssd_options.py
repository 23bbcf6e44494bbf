"""The proto's modes and SSD options map to the engine's enums at the boundary, on both sides, and back.

Hello.ssd is the session's SSD setting; Prefill.mode says SD or SSD. The deprecated string / bool fields
(older targets) are still read, the enum fields win over them, and an unknown value is INVALID_ARGUMENT.
"""

import asyncio
import itertools
import queue
import threading

import grpc
import pytest
from grpc import aio

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer
from draft_service.session import Session
from draft_service.ssd_options import options_config, prefill_mode
from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from rpc.engine_errors import ENGINE_STATUS
from rpc.errors import ErrorMappingInterceptor
from ssd.config import Backup, DecodeMode, FanOut, SsdConfig
from ssd.errors import InvalidRequestError
from target_service.ssd_wire import PREFILL_MODES, ssd_options
from tests.tiny_models import write_tiny_checkpoint

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
K = 3
SSD = common_pb2.SPECULATION_MODE_SSD


@pytest.mark.parametrize(("fan_out", "backup"), list(itertools.product(FanOut, Backup)))
def test_the_targets_options_read_back_as_the_same_config(fan_out, backup):
    sent = SsdConfig(fan_out_budget=5, fan_out=fan_out, backup=backup, saguaro_c=0.25)
    wire = draft_pb2.SsdOptions.FromString(ssd_options(sent).SerializeToString())
    assert not wire.fan_out and not wire.backup  # a target sends the enum fields only
    got = options_config(SsdConfig(backup_max_neural_batch=sent.backup_max_neural_batch), wire)
    assert got == sent and got.fan_out is fan_out and got.backup is backup


def test_a_fan_out_budget_of_zero_is_a_value_and_an_unset_one_the_drafts_default():
    default = SsdConfig(fan_out_budget=8)
    zero = draft_pb2.SsdOptions.FromString(ssd_options(SsdConfig(fan_out_budget=0)).SerializeToString())
    assert options_config(default, zero).fan_out_budget == 0  # `--f 0` reaches the draft: no branches
    assert options_config(default, draft_pb2.SsdOptions()).fan_out_budget == 8


def test_deprecated_strings_are_read_when_the_enums_are_unset_and_lose_to_them():
    default = SsdConfig()
    old = options_config(default, draft_pb2.SsdOptions(fan_out="uniform", backup="fast"))
    assert (old.fan_out, old.backup) == (FanOut.UNIFORM, Backup.FAST)
    both = options_config(default, draft_pb2.SsdOptions(fan_out="uniform", fan_out_kind=draft_pb2.FAN_OUT_KIND_GEOMETRIC,
                                                        backup="fast", backup_kind=draft_pb2.BACKUP_KIND_NEURAL))
    assert (both.fan_out, both.backup) == (FanOut.GEOMETRIC, Backup.NEURAL)
    assert options_config(default, draft_pb2.SsdOptions()) == default


@pytest.mark.parametrize(("options", "words"), [
    (draft_pb2.SsdOptions(fan_out_kind=7), "fan-out"),
    (draft_pb2.SsdOptions(backup_kind=9), "backup"),
    (draft_pb2.SsdOptions(fan_out="spiral"), "fan-out must be one of geometric, uniform"),
    (draft_pb2.SsdOptions(backup="slow"), "backup must be one of auto, neural, fast"),
])
def test_an_unknown_kind_is_an_invalid_request(options, words):
    with pytest.raises(InvalidRequestError, match=words):
        options_config(SsdConfig(), options)


def test_a_prefills_mode_or_its_deprecated_flag():
    assert prefill_mode(draft_pb2.Prefill(mode=SSD)) is DecodeMode.SSD
    assert prefill_mode(draft_pb2.Prefill(mode=common_pb2.SPECULATION_MODE_SD, ssd=True)) is DecodeMode.SD
    assert prefill_mode(draft_pb2.Prefill(ssd=True)) is DecodeMode.SSD
    assert prefill_mode(draft_pb2.Prefill()) is DecodeMode.SD
    assert {prefill_mode(draft_pb2.Prefill(mode=m)) for m in PREFILL_MODES.values()} == set(PREFILL_MODES)
    for bad in (common_pb2.SPECULATION_MODE_AR, 42):
        with pytest.raises(InvalidRequestError, match="mode"):
            prefill_mode(draft_pb2.Prefill(mode=bad))


def test_the_python_enums_take_their_names_and_refuse_others():
    assert SsdConfig(fan_out="uniform", backup="neural") == SsdConfig(fan_out=FanOut.UNIFORM, backup=Backup.NEURAL)
    assert SsdConfig(backup=Backup.AUTO, backup_max_neural_batch=2).backup_for(3) is Backup.FAST
    assert SsdConfig(backup=Backup.AUTO, backup_max_neural_batch=2).backup_for(2) is Backup.NEURAL
    with pytest.raises(InvalidRequestError, match="fan-out must be one of geometric, uniform"):
        SsdConfig(fan_out="spiral")


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    write_tiny_checkpoint(folder, "llama", seed=0)
    return build_service_proposer(DraftServiceConfig(draft_engine(str(folder), kv_cache_memory_mb=8)))


def test_the_sessions_options_apply_to_its_ssd_sequences_and_a_rounds_over_them(draft):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    session.set_ssd_options(ssd_options(SsdConfig(fan_out_budget=3, fan_out=FanOut.UNIFORM, saguaro_c=0.5)))
    plain = draft_pb2.Prefill(seq_id=1, token_ids=PROMPT, mode=common_pb2.SPECULATION_MODE_SD)
    result = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[
        plain, draft_pb2.Prefill(seq_id=2, token_ids=PROMPT, mode=SSD)]))
    config = result.build.config
    assert (config.fan_out_budget, config.fan_out, config.saguaro_c) == (3, FanOut.UNIFORM, 0.5)
    assert config.backup_max_neural_batch == draft.ssd.config.backup_max_neural_batch  # no field: the draft's
    assert [p.request.seq_id for p in result.build.pending] == [session.seqs[2].seq_id]  # only SSD builds
    older = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[
        draft_pb2.Prefill(seq_id=3, token_ids=PROMPT, ssd=True)], ssd=draft_pb2.SsdOptions(fan_out_budget=2)))
    assert (older.build.config.fan_out_budget, older.build.config.fan_out) == (2, FanOut.UNIFORM)
    session.close()


def test_a_prefill_in_ar_mode_is_refused_alone(draft):
    session = Session(draft.proposer, "test", ssd=draft.ssd)
    out = session.run_round(draft_pb2.Round(num_speculative_tokens=K, prefills=[
        draft_pb2.Prefill(seq_id=1, token_ids=PROMPT, mode=common_pb2.SPECULATION_MODE_AR),
        draft_pb2.Prefill(seq_id=2, token_ids=PROMPT, mode=SSD)]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(1, "INVALID_ARGUMENT")]
    assert [i.seq_id for i in out.items] == [2] and list(session.seqs) == [2]
    session.close()


@pytest.fixture
def server(draft):
    """A SpeculatorServicer on a real grpc.aio server, in a thread of its own."""
    state: dict = {}
    started = threading.Event()

    async def serve() -> None:
        servicer = SpeculatorServicer(draft, "tiny")
        server = aio.server(interceptors=[ErrorMappingInterceptor(ENGINE_STATUS)])  # as the service's
        draft_pb2_grpc.add_SpeculatorServicer_to_server(servicer, server)
        stop = asyncio.Event()
        state.update(port=server.add_insecure_port("127.0.0.1:0"), stop=stop, loop=asyncio.get_running_loop())
        await server.start()
        started.set()
        await stop.wait()
        await server.stop(0)
        await servicer.close()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert started.wait(30)
    yield state
    state["loop"].call_soon_threadsafe(state["stop"].set)
    thread.join(10)


@pytest.mark.parametrize("options", [draft_pb2.SsdOptions(backup_kind=9), draft_pb2.SsdOptions(saguaro_c=2.0),
                                     draft_pb2.SsdOptions(fan_out_budget=10**6)])
def test_a_hello_with_bad_ssd_options_ends_the_session_with_invalid_argument(server, options):
    requests: queue.SimpleQueue = queue.SimpleQueue()
    with grpc.insecure_channel(f"127.0.0.1:{server['port']}") as channel:
        answers = draft_pb2_grpc.SpeculatorStub(channel).Session(iter(requests.get, None), timeout=30)
        requests.put(draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="t", ssd=options)))
        with pytest.raises(grpc.RpcError) as e:
            next(answers)
        requests.put(None)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
