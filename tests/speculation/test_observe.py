"""The round's outcome is a value the verifier makes once and every proposer reads (`observe`): a grammar splice
counts as accepted, proposers roll back by its length, SSD keys its cache on it, and the draft service refuses an
outcome for a sequence it does not hold with a typed error."""

import pytest
import torch

from draft_service.session import Session
from protos.ssd.v1 import draft_pb2
from ssd.engine import speculative_decoder
from ssd.errors import UnknownSequenceError
from ssd.speculation.draft_record import DraftRecord
from ssd.speculation.ngram import NgramProposer
from ssd.speculation.round_outcome import RoundOutcome
from tests.speculation.test_grammar import _llm
from tests.speculation.test_grammar_drafting import PARAMS, PROMPTS, _spec


def test_valid_length_counts_only_the_tokens_the_proposer_drafted():
    assert RoundOutcome(1, 10, [4, 5, 6], 2).valid_length == 12  # two accepted, then the bonus
    assert RoundOutcome(1, 10, [4, 5, 6], 2, num_own_accepted=1).valid_length == 11  # the second was spliced in
    assert RoundOutcome.plain(1, 10, [4]).valid_length == 10
    assert RoundOutcome(1, 10, [4, 5, 6], 2).is_own_speculation
    assert not RoundOutcome(1, 10, [4, 5, 6], 2, num_own_accepted=1).is_own_speculation
    assert not RoundOutcome.plain(1, 10, [4]).is_own_speculation


def test_a_grammar_splice_counts_as_accepted_and_greedy_output_is_plain(letters, monkeypatch):
    """A draft blind to the grammar misses its forced runs; the target splices them in and the verifier counts
    them in k, so the outcome's k covers them and its own count stops at the first one."""
    plain = [o.token_ids for o in _llm(letters).generate(PROMPTS, PARAMS)]
    monkeypatch.setattr(speculative_decoder, "AnswerGrammar", lambda *_: None)  # the draft does not see the grammar
    llm = _llm(letters, _spec(letters[1], "chain"))
    proposer, seen = llm.engine.speculative_decoder.proposer, []
    real = proposer.observe

    def recording(seq_id: int, outcome: RoundOutcome) -> None:
        seen.append(outcome)
        real(seq_id, outcome)

    monkeypatch.setattr(proposer, "observe", recording)
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == plain
    verified = [o for o in seen if o.num_accepted >= 0]
    assert verified and all(len(o.new_tokens) == o.num_accepted + 1 for o in verified)
    assert any(o.num_own_accepted is not None and o.num_own_accepted < o.num_accepted for o in verified)


def test_ssd_keys_its_cache_on_the_first_outcome_after_its_answer_and_misses_after_a_splice():
    records = {i: DraftRecord(i, list(range(10)), 0.0, torch.Generator()) for i in (1, 2, 3)}
    records[1].answered([4, 5, 6], is_hit=False)
    records[1].observe(RoundOutcome(1, 10, [4, 9], 1))
    assert records[1].outcome == (1, 9)
    records[1].observe(RoundOutcome.plain(1, 12, [7]))  # a plain step after it: the draft's answer is no longer last
    assert records[1].outcome is None
    records[2].answered([4, 5, 6], is_hit=False)
    records[2].observe(RoundOutcome(2, 10, [3, 5, 9], 2, num_own_accepted=0))  # s_1 spliced: no branch of the draft's
    assert records[2].outcome is None
    records[3].observe(RoundOutcome(3, 10, [4, 9], 1))  # never answered: nothing to key
    assert records[3].outcome is None and not records[3].last_speculation


def test_an_outcome_for_an_unknown_sequence_is_a_typed_error_on_the_draft():
    session = Session(NgramProposer(), "test")
    outcome = draft_pb2.Outcome(seq_id=5, num_committed_before=3, new_token_ids=[4], num_accepted=0, bonus_token=4)
    with pytest.raises(UnknownSequenceError):
        session._outcome(outcome)
    out = session.run_round(draft_pb2.Round(num_speculative_tokens=2, outcomes=[outcome]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(5, "NOT_FOUND")]


@pytest.mark.parametrize("bad", [
    dict(num_accepted=1, bonus_token=7),  # the bonus is not the last new token
    dict(num_accepted=2, bonus_token=4),  # more accepted than new tokens allow
    dict(num_accepted=1, bonus_token=4, num_own_accepted=2),  # more own than accepted
])
def test_an_outcome_that_contradicts_its_tokens_is_refused_and_the_sequence_dropped(bad):
    session = Session(NgramProposer(), "test")
    session.run_round(draft_pb2.Round(num_speculative_tokens=2, prefills=[
        draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 1, 2])]))
    out = session.run_round(draft_pb2.Round(num_speculative_tokens=2, outcomes=[draft_pb2.Outcome(
        seq_id=1, num_committed_before=5, new_token_ids=[3, 4], **bad)]))
    assert [(e.seq_id, e.code) for e in out.errors] == [(1, "INVALID_ARGUMENT")] and 1 not in session.seqs
