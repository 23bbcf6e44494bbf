"""RemoteProposer <-> an in-process EAGLE-3 draft server: features sent, and lost ones after a reconnect.

The draft's gRPC server runs on an event loop in a thread of the test; the engine's side is driven
by hand with ProposeRequests carrying random target features.
"""

import dataclasses

import pytest
import torch

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from protos.ssd.v1 import common_pb2
from rpc.shared_memory import live_segments
from ssd.speculation.proposer import ProposeRequest
from target_service.remote_proposer import RemoteProposer, fetch_feature_layers
from tests.integration.helpers import wait_for
from tests.integration.threaded_draft import threaded_draft_server
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

K = 3
SHM, INLINE = common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY, common_pb2.TENSOR_TRANSPORT_INLINE


@pytest.fixture(scope="module")
def draft_address(tmp_path_factory):
    target, head = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("eagle3")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_head(head, target)
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(head)), target_model=str(target)))
    with threaded_draft_server(draft, str(head)) as address:
        yield address


def request(seq_id: int, tokens: list[int], start: int, features: torch.Tensor | None,
            temperature: float = 0.0) -> ProposeRequest:
    return ProposeRequest(seq_id, tokens, K, temperature, torch.Generator(), None, features, start)


@pytest.mark.parametrize("transport", [SHM, INLINE], ids=["shared-memory", "inline"])
def test_features_reach_the_draft_and_a_reconnect_resends_sequences_whole(draft_address, transport):
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
        old.close()  # the stream breaks: the next session gets sequence 1 with every feature it was sent
        assert wait_for(lambda: proposer.is_connected and proposer.pool.sessions[0] is not old)
        tokens = [*tokens, 42]
        resent = proposer.propose([request(1, tokens, 6, torch.randn(1, width)),
                                   request(2, [9, 10, 11, 12], 0, torch.randn(3, width))])
        assert len(resent[0].tokens) == K and len(resent[1].tokens) == K
        gap = proposer.propose([request(4, [9, 10, 11, 12, 13], 3, torch.randn(1, width))])  # positions 0..2 never sent
        assert gap[0].tokens == []
        later = proposer.propose([request(4, [9, 10, 11, 12, 13, 14], 4, torch.randn(1, width))])
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


def _recording(proposer: RemoteProposer) -> list:
    """Keep every message the proposer's (one) draft session sends."""
    session, sent = proposer.pool.sessions[0], []
    send = session.send
    session.send = lambda message: (sent.append(message), send(message))[1]
    return sent


def test_a_prefix_hit_sends_the_rest_and_a_draft_without_the_blocks_gets_it_whole(draft_address):
    """The target's prefix cache served 16 prompt tokens: the Prefill says so and carries features from position 15
    on; the draft restores head positions 0..14 from its own prefix cache. A prompt the draft has no blocks of is
    refused (FAILED_PRECONDITION, no speculation this round) and resent whole the next round."""
    layers = fetch_feature_layers(draft_address, timeout_s=10)
    proposer = RemoteProposer(draft_address, "test", 96, timeout_s=10, reconnect_interval_s=0.05,
                              feature_layers=layers)
    try:
        assert wait_for(lambda: proposer.is_connected)
        sent = _recording(proposer)
        torch.manual_seed(1)
        feats, shared = torch.randn(40, 3 * 64), [(3 * i) % 90 + 2 for i in range(16)]  # one 16-token block
        first = proposer.propose([request(10, [*shared, 50, 51], 0, feats[:17])])
        assert len(first[0].tokens) == K
        proposer.release(10)  # the head block of `shared` stays in the draft's prefix cache
        hit = dataclasses.replace(request(11, [*shared, 60, 61, 62], 0, feats[:18]), num_cached_tokens=16)
        assert len(proposer.propose([hit])[0].tokens) == K
        prefill = sent[-1].round.prefills[0]
        assert (prefill.num_cached_tokens, prefill.features_start, list(prefill.features.shape)) == (16, 15, [3, 192])

        other = [(5 * i) % 90 + 2 for i in range(16)]  # never seen by the draft
        miss = dataclasses.replace(request(12, [*other, 70, 71], 0, feats[:17]), num_cached_tokens=16)
        assert proposer.propose([miss])[0].tokens == []  # refused: a plain decode step
        again = dataclasses.replace(request(12, [*other, 70, 71, 72], 17, feats[17:18]), num_cached_tokens=16)
        assert len(proposer.propose([again])[0].tokens) == K
        prefill = sent[-1].round.prefills[0]
        assert (prefill.num_cached_tokens, prefill.features_start, prefill.features.shape[0]) == (0, 0, 18)
        assert proposer.is_connected
    finally:
        proposer.close()
