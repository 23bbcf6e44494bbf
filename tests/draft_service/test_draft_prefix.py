"""A Prefill that says how many prompt tokens the target's prefix cache served: the draft starts it from its own
head blocks and needs features of the rest only; a draft without those blocks refuses it (FAILED_PRECONDITION)
and drafts the same once it gets every feature."""

import pytest
import torch

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from draft_service.session import Session
from protos.ssd.v1 import draft_pb2
from tests.draft_service.test_eagle_session import wire
from tests.speculation.test_eagle3_sd import tiny_target_and_head

K = 3
SHARED = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # 3 blocks of 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


def _session(folders, cache_blocks: int = 64) -> Session:
    target, head = folders
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(head), block_size=4), target_model=str(target),
                                                      prefix_cache_blocks=cache_blocks))
    return Session(draft.proposer, "test", draft.feature_width)


def _prefill(session: Session, seq_id: int, tokens: list[int], features: torch.Tensor,
             num_cached: int = 0) -> draft_pb2.Speculations:
    """One round with one Prefill; features of positions num_cached - 1 .. (all, when num_cached is 0)."""
    start = max(num_cached - 1, 0)
    prefill = draft_pb2.Prefill(seq_id=seq_id, token_ids=tokens, features=wire(features[start : len(tokens) - 1]),
                                features_start=start, num_cached_tokens=num_cached)
    return session.run_round(draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill]))


def test_a_cached_prefix_needs_only_the_rest_and_drafts_the_same(folders):
    session = _session(folders)
    torch.manual_seed(0)
    features = torch.randn(32, session.feature_width)  # position p's target features: row p
    first = _prefill(session, 1, [*SHARED, 40], features)
    assert not first.errors and len(first.items[0].token_ids) == K
    session.release([1])  # its head blocks stay in the draft's prefix cache
    second = [*SHARED, 41, 42]
    hit = _prefill(session, 2, second, features, num_cached=12)  # features of positions 11, 12 only
    assert not hit.errors
    cache = session.proposer.prefix_cache
    assert cache.counters.num_hit_positions == 11  # head positions 0..10 restored
    fresh = _prefill(_session(folders, cache_blocks=0), 2, second, features)  # every feature, no cache
    assert list(hit.items[0].token_ids) == list(fresh.items[0].token_ids)


def test_a_draft_without_the_blocks_refuses_then_drafts_from_every_feature(folders):
    restarted = _session(folders)  # never saw the first turn
    torch.manual_seed(0)
    features = torch.randn(32, restarted.feature_width)
    second = [*SHARED, 41, 42]
    refused = _prefill(restarted, 2, second, features, num_cached=12)
    assert not refused.items and refused.errors[0].code == "FAILED_PRECONDITION"
    assert "prefix cache" in refused.errors[0].message and 2 not in restarted.seqs
    whole = _prefill(restarted, 2, second, features)
    expected = _prefill(_session(folders, cache_blocks=0), 2, second, features)
    assert not whole.errors and list(whole.items[0].token_ids) == list(expected.items[0].token_ids)


def test_num_cached_tokens_must_leave_the_last_token(folders):
    session = _session(folders)
    out = _prefill(session, 3, [*SHARED], torch.randn(32, session.feature_width), num_cached=12)
    assert out.errors[0].code == "INVALID_ARGUMENT" and "num_cached_tokens" in out.errors[0].message


def test_the_draft_metrics_count_prefix_queries_and_hits(folders):
    from draft_service.servicer import SpeculatorServicer
    from tests.draft_service.test_metrics import scrape

    target, head = folders
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(head), block_size=4), target_model=str(target)))
    servicer = SpeculatorServicer(draft, "head")
    try:
        session = Session(draft.proposer, "test", draft.feature_width)
        features = torch.randn(32, session.feature_width)
        _prefill(session, 1, [*SHARED, 40], features)
        _prefill(session, 2, [*SHARED, 41, 42], features, num_cached=12)
        series = scrape(servicer, "head")
    finally:
        servicer.worker.close()
    assert series["ssd:draft_prefix_cache_hits"] == ("counter", {(): 11.0})
    queries = series["ssd:draft_prefix_cache_queries"]
    assert queries[0] == "counter" and queries[1][()] >= 11 + 11  # the first sequence asked too (and missed)
