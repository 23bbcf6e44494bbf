"""RemoteProposer <-> an in-process EAGLE-3 draft server: features sent, and lost ones after a reconnect.

The draft's gRPC server runs on an event loop in a thread of the test; the engine's side is driven
by hand with ProposeRequests carrying random target features.
"""

import asyncio
import threading

import pytest
import torch

from deploy.local import free_port
from draft_service.config import DraftServiceConfig
from draft_service.proposers import build_service_proposer
from draft_service.servicer import SpeculatorServicer
from protos.ssd.v1 import common_pb2, draft_pb2_grpc
from rpc.engine_errors import ENGINE_STATUS
from rpc.server import GrpcServer, ServiceSpec
from rpc.shared_memory import live_segments
from ssd.speculation.proposer import ProposeRequest
from target_service.remote_proposer import RemoteProposer, fetch_feature_layers
from tests.integration.helpers import wait_for
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

K = 3
SHM, INLINE = common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY, common_pb2.TENSOR_TRANSPORT_INLINE


@pytest.fixture(scope="module")
def draft_address(tmp_path_factory):
    target, head = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("eagle3")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_head(head, target)
    draft = build_service_proposer(DraftServiceConfig(draft=str(head), target_model=str(target)))
    address = f"127.0.0.1:{free_port()}"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servicer = SpeculatorServicer(draft, str(head))

    async def start() -> GrpcServer:
        spec = ServiceSpec("ssd.v1.Speculator", servicer, draft_pb2_grpc.add_SpeculatorServicer_to_server)
        server = GrpcServer([spec], address, ENGINE_STATUS, grace_s=0.5)
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield address
    asyncio.run_coroutine_threadsafe(server.server.stop(0.5), loop).result(30)
    asyncio.run_coroutine_threadsafe(servicer.close(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def request(seq_id: int, tokens: list[int], start: int, features: torch.Tensor | None,
            temperature: float = 0.0) -> ProposeRequest:
    return ProposeRequest(seq_id, tokens, K, temperature, torch.Generator(), None, features, start)


@pytest.mark.parametrize("transport", [SHM, INLINE], ids=["shared-memory", "inline"])
def test_features_reach_the_draft_and_a_reconnect_drops_old_sequences(draft_address, transport):
    layers = fetch_feature_layers(draft_address, timeout_s=10)
    assert layers == (0, 1, 2)
    before = live_segments()
    proposer = RemoteProposer(draft_address, "test", 96, timeout_s=10, reconnect_interval_s=0.05,
                              feature_layers=layers, offer_shared_memory=transport == SHM)
    try:
        assert wait_for(lambda: proposer.is_connected)
        assert proposer.pool.sessions[0].tensors.transport == transport
        tokens, width = [5, 6, 7, 8, 40], 3 * 64
        first = proposer.propose([request(1, tokens, 0, torch.randn(4, width, dtype=torch.bfloat16))])
        assert len(first[0].tokens) == K  # bfloat16 features crossed the wire
        tokens = [*tokens, 41]
        second = proposer.propose([request(1, tokens, 4, torch.randn(2, width, dtype=torch.bfloat16))])
        assert len(second[0].tokens) == K  # the outcome's features extend the draft's

        old = proposer.pool.sessions[0]
        old.close()  # the stream breaks: the next session re-sends sequence 1 without its old features
        assert wait_for(lambda: proposer.is_connected and proposer.pool.sessions[0] is not old)
        tokens = [*tokens, 42]
        resent = proposer.propose([request(1, tokens, 6, torch.randn(1, width)),
                                   request(2, [9, 10, 11, 12], 0, torch.randn(3, width))])
        assert resent[0].tokens == [] and len(resent[1].tokens) == K
        later = proposer.propose([request(1, [*tokens, 43], 7, torch.randn(1, width))])
        assert later[0].tokens == [] and proposer.is_connected  # no speculation, no error, session kept
        sampled = proposer.propose([request(3, [9, 10, 11], 0, torch.randn(2, width), temperature=1.0)])[0]
        assert sampled.q.shape == (K, 96) and torch.allclose(sampled.q.sum(-1), torch.ones(K))  # q came back
    finally:
        proposer.close()
    assert wait_for(lambda: not live_segments() - before, timeout_s=10)  # both sides unlinked their segments


def test_a_target_without_the_drafts_feature_layers_stays_in_ar(draft_address):
    proposer = RemoteProposer(draft_address, "test", 96, timeout_s=10, reconnect_interval_s=0.05)
    try:
        assert not wait_for(lambda: proposer.is_connected, timeout_s=1.0)  # refused: wrong features
        assert proposer.propose([request(1, [5, 6, 7], 0, None)])[0].tokens == []
    finally:
        proposer.close()
