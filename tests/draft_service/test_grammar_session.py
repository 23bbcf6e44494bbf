"""Structured output on the draft service: a Prefill's grammar is compiled on the draft (over the draft's tokenizer)
and the draft proposes only tokens it allows, plain SD and SSD; a grammar the draft cannot compile is drafted
without (the target enforces it anyway). Tiny Llamas over the letter tokenizer of tests/letter_models.py.
"""

from structlog.testing import capture_logs

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from draft_service.session import Session
from protos.ssd.v1 import common_pb2, draft_pb2
from ssd.config import SsdConfig
from ssd.sampling.grammar import Grammar, GrammarCompiler
from tests.letter_models import EOS
from tests.speculation.test_grammar import PROMPT

REGEX = "[a-n]{2,4}(cdefghij|klm)[a-n]{2,4}"
K = 4


def _allowed_everywhere(compiler: GrammarCompiler, answer: list[int], tokens: list[int]) -> bool:
    rows = compiler.compile(Grammar("regex", REGEX)).allowed(answer, [tokens[:i] for i in range(len(tokens))])
    return all(rows[i, t] for i, t in enumerate(tokens))


def test_the_draft_compiles_a_prefills_grammar_and_proposes_only_what_it_allows(letters):
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(letters[1]), kv_cache_memory_mb=8),
                                                      ssd=SsdConfig(backup="neural")))  # a miss drafts now
    assert draft.grammars is not None  # the draft folder has a tokenizer.json
    session = Session(draft.proposer, "test", ssd=draft.ssd, grammars=draft.grammars)
    compiler = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS}))
    answer = [2, 3]  # "ab", already committed
    tokens = [*PROMPT, *answer]

    def prefill(seq_id: int, ssd: bool, regex: str = REGEX) -> draft_pb2.Prefill:
        return draft_pb2.Prefill(seq_id=seq_id, token_ids=tokens, ssd=ssd, grammar=common_pb2.Grammar(regex=regex),
                                 answer_start=len(PROMPT))

    with capture_logs() as logs:
        first = session.answer(draft_pb2.Round(num_speculative_tokens=K, prefills=[
            prefill(1, ssd=False), prefill(2, ssd=True), prefill(3, ssd=False, regex="(")]))
    items = {item.seq_id: list(item.token_ids) for item in first.speculations.items}
    assert set(items) == {1, 2, 3} and not first.speculations.errors
    assert _allowed_everywhere(compiler, answer, items[1]) and _allowed_everywhere(compiler, answer, items[2])
    assert session.seqs[3].grammar is None  # not compilable here: drafted without a grammar
    assert any(e["event"].startswith("cannot compile the sequence's grammar") for e in logs)
    assert [e["event"] for e in logs].count("drafting structured output under its grammar") == 1  # once a session
    session.build(first.build)
    spec = items[2]
    outcome = draft_pb2.Outcome(seq_id=2, num_committed_before=len(tokens), new_token_ids=[*spec[:1], 4],
                                num_accepted=1, bonus_token=4)  # one accepted, then "c" (allowed there)
    assert _allowed_everywhere(compiler, answer, [*spec[:1], 4])
    second = session.answer(draft_pb2.Round(num_speculative_tokens=K, outcomes=[outcome]))
    (item,) = second.speculations.items
    assert _allowed_everywhere(compiler, [*answer, *spec[:1], 4], list(item.token_ids))
    session.close()
