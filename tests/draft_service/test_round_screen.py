"""Rounds screened on the draft's event loop (draft_service/round_screen.py): a bad round raises, bad sequences
are taken out of the round with their error, good ones go on to the worker untouched."""

import pytest

from draft_service.deadlines import SessionDeadlines
from draft_service.limits import SessionLimits
from draft_service.round_screen import screen
from draft_service.session import Session
from protos.ssd.v1 import common_pb2, draft_pb2
from ssd.errors import InvalidRequestError
from ssd.speculation.ngram import NgramProposer

VOCAB, WIDTH = 100, 6
GOOD = draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 1, 2, 3, 1, 2])


def _session() -> Session:
    s = Session(NgramProposer(), "test", feature_width=WIDTH, vocab_size=VOCAB,
                limits=SessionLimits(max_model_len=64, max_sequences=8))
    s.run_round(draft_pb2.Round(num_speculative_tokens=2, prefills=[draft_pb2.Prefill(seq_id=5, token_ids=[1, 2, 3])]))
    return s


def _features(rows: int, width: int = WIDTH, num_bytes: int | None = None) -> common_pb2.Tensor:
    size = rows * width * 4 if num_bytes is None else num_bytes
    return common_pb2.Tensor(shape=[rows, width], dtype="float32", inline_bytes=b"\0" * size)


def test_a_round_past_its_limits_raises():
    with pytest.raises(InvalidRequestError):
        screen(draft_pb2.Round(num_speculative_tokens=10**6, prefills=[GOOD]), _session(), SessionDeadlines())


def test_a_clean_round_goes_on_as_it_is():
    round_ = draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD], outcomes=[
        draft_pb2.Outcome(seq_id=5, num_committed_before=3, new_token_ids=[1], num_accepted=-1)])
    out = screen(round_, _session(), SessionDeadlines())
    assert out.round is round_ and not out.errors and not out.drop


BAD = {
    "token id 10^9": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 10**9]), "INVALID_ARGUMENT"),
    "empty": (draft_pb2.Prefill(seq_id=2), "INVALID_ARGUMENT"),
    "too long": (draft_pb2.Prefill(seq_id=2, token_ids=[1] * 65), "INVALID_ARGUMENT"),
    "features of a wrong width": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2, 3], features=_features(2, 5)),
                                  "INVALID_ARGUMENT"),
    "features past the tokens": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2, 3], features=_features(4)),
                                 "INVALID_ARGUMENT"),
    "features of a wrong byte count": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2, 3],
                                                         features=_features(2, num_bytes=7)), "INVALID_ARGUMENT"),
    "deadline passed": (draft_pb2.Prefill(seq_id=2, token_ids=[1, 2], time_left_ms=-5), "DEADLINE_EXCEEDED"),
    "outcome of an unknown sequence": (draft_pb2.Outcome(seq_id=9, num_committed_before=0, new_token_ids=[1]),
                                       "NOT_FOUND"),
    "outcome past the held tokens": (draft_pb2.Outcome(seq_id=5, num_committed_before=4, new_token_ids=[1]),
                                     "INVALID_ARGUMENT"),
    "too long an outcome": (draft_pb2.Outcome(seq_id=5, num_committed_before=3, new_token_ids=[1] * 62),
                            "INVALID_ARGUMENT"),
    "outcome with an id outside the vocabulary": (draft_pb2.Outcome(seq_id=5, num_committed_before=3,
                                                                    new_token_ids=[VOCAB]), "INVALID_ARGUMENT"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_sequence_is_taken_out_with_its_code(name):
    bad, code = BAD[name]
    round_ = draft_pb2.Round(num_speculative_tokens=2, prefills=[GOOD])
    (round_.prefills if isinstance(bad, draft_pb2.Prefill) else round_.outcomes).append(bad)
    out = screen(round_, _session(), SessionDeadlines())
    assert [(e.seq_id, e.code) for e in out.errors] == [(bad.seq_id, code)]
    assert [p.seq_id for p in out.round.prefills] == [1] and not out.round.outcomes
    assert out.drop == ([] if code == "NOT_FOUND" else [bad.seq_id])


def test_a_round_of_bad_sequences_only_leaves_nothing_for_the_worker():
    round_ = draft_pb2.Round(num_speculative_tokens=2, prefills=[draft_pb2.Prefill(seq_id=2, token_ids=[-1])])
    out = screen(round_, _session(), SessionDeadlines())
    assert out.round is None and [e.code for e in out.errors] == ["INVALID_ARGUMENT"]
