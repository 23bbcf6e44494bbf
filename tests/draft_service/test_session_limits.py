"""The draft's Session refuses what a target may not ask: bad rounds raise, bad sequences are refused alone."""

import math

import pytest
import torch

from draft_service.limits import SessionLimits
from draft_service.session import Session
from protos.ssd.v1 import draft_pb2
from rpc.tensors import to_tensor
from ssd.errors import InvalidRequestError
from ssd.speculation.ngram import NgramProposer

VOCAB = 100
GOOD = draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 1, 2, 3, 1, 2])


def session(**limits) -> Session:  # noqa: ANN003
    return Session(NgramProposer(), "test", vocab_size=VOCAB, limits=SessionLimits(max_model_len=64, **limits))


@pytest.mark.parametrize("round_", [
    draft_pb2.Round(num_speculative_tokens=10**6, prefills=[GOOD]),
    draft_pb2.Round(num_speculative_tokens=-1, prefills=[GOOD]),
    draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD], tree=draft_pb2.TreeShape(budget=10**6, depth=2, top_k=2)),
    draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD], tree=draft_pb2.TreeShape(budget=8, depth=2, top_k=10**6)),
    draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD], tree=draft_pb2.TreeShape(budget=8, depth=10**6, top_k=2)),
    draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD], ssd=draft_pb2.SsdOptions(fan_out_budget=10**6)),
    draft_pb2.Round(num_speculative_tokens=2, prefills=[draft_pb2.Prefill(seq_id=i, token_ids=[1]) for i in range(9)]),
    draft_pb2.Round(num_speculative_tokens=2, prefills=[draft_pb2.Prefill(seq_id=i, token_ids=[1] * 60)
                                                        for i in range(3)]),  # 180 tokens > 128
])
def test_a_round_past_the_limits_is_refused_before_any_state_changes(round_):
    s = session(max_sequences=8, max_round_tokens=128)
    with pytest.raises(InvalidRequestError):
        s.answer(round_)
    assert not s.seqs


@pytest.mark.parametrize(("bad", "words"), [
    (draft_pb2.Prefill(seq_id=2, token_ids=[1, 10**9]), "outside the vocabulary"),
    (draft_pb2.Prefill(seq_id=2, token_ids=[-5, 1]), "outside the vocabulary"),
    (draft_pb2.Prefill(seq_id=2, token_ids=[1] * 65), "max_model_len"),
    (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2], temperature=math.nan), "temperature"),
    (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2], temperature=-1.0), "temperature"),
])
def test_a_bad_prefill_is_refused_alone(bad, words):
    s = session()
    out = s.run_round(draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD, bad]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(2, "INVALID_ARGUMENT")] and words in out.errors[0].message
    assert [i.seq_id for i in out.items] == [1] and list(s.seqs) == [1]


def test_a_bad_outcome_drops_its_sequence():
    s = session()
    s.run_round(draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD, draft_pb2.Prefill(seq_id=2, token_ids=[4])]))
    out = s.run_round(draft_pb2.Round(num_speculative_tokens=2, outcomes=[
        draft_pb2.Outcome(seq_id=1, num_committed_before=8, new_token_ids=[VOCAB], num_accepted=0),
        draft_pb2.Outcome(seq_id=2, num_committed_before=1, new_token_ids=[5], num_accepted=-1)]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(1, "INVALID_ARGUMENT")]
    assert list(s.seqs) == [2] and len(s.seqs[2].token_ids) == 2


def test_a_full_session_refuses_new_sequences():
    s = session(max_sequences=2)
    prefills = [draft_pb2.Prefill(seq_id=i, token_ids=[1, 2]) for i in (1, 2)]
    s.run_round(draft_pb2.Round(num_speculative_tokens=1, prefills=prefills))
    out = s.run_round(draft_pb2.Round(num_speculative_tokens=1, prefills=[draft_pb2.Prefill(seq_id=3, token_ids=[1])]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(3, "RESOURCE_EXHAUSTED")] and sorted(s.seqs) == [1, 2]


@pytest.mark.parametrize(("rows", "start", "inline_bytes"), [(9, 0, None), (2, -1, None), (8, 0, b"\0" * 12)])
def test_features_of_the_wrong_rows_or_bytes_are_refused(rows, start, inline_bytes):
    s = Session(NgramProposer(), "test", feature_width=3, vocab_size=VOCAB)
    features = to_tensor(torch.zeros(rows, 3).numpy())  # [rows, F]
    if inline_bytes is not None:
        features.inline_bytes = inline_bytes
    prefill = draft_pb2.Prefill(seq_id=1, token_ids=GOOD.token_ids, features=features, features_start=start)
    out = s.run_round(draft_pb2.Round(num_speculative_tokens=2, prefills=[prefill]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(1, "INVALID_ARGUMENT")] and not s.seqs
