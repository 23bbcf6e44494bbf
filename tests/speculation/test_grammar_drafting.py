"""Drafting under a structured-output grammar: the proposers see the request's grammar and propose only tokens it
allows (draft model and EAGLE-3 head, chains, trees and SSD's cache and backups). A matter of speed: the target's
mask alone keeps the answer exact, so greedy output stays the plain one and sampling stays the masked target's.

Uses the letter tokenizer and tiny Llamas of tests/letter_models.py.
"""

import pytest
import torch

from ssd import config as spec_config
from ssd.config import TreeShape
from ssd.engine import speculative_decoder
from ssd.sampling.grammar import AnswerGrammar, Grammar, GrammarCompiler
from ssd.sampling.params import SamplingParams
from tests.letter_models import EOS
from tests.speculation.exact_distribution import chi_square_pvalue
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.speculation.test_grammar import PROMPT, _exact, _llm, _samples

PROMPTS = [PROMPT, [5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13]]
# forced runs ("cdefghij", "klm") between free stretches; the head's vocabulary (g..n) lacks a..f
PARAMS = SamplingParams(max_tokens=24, grammar=Grammar("regex", "[a-n]{2,4}(cdefghij|klm)[a-n]{2,4}"))


@pytest.fixture(scope="module")
def head(letters, tmp_path_factory):  # noqa: ANN001, ANN201
    """A tiny EAGLE-3 head over the letters target whose draft vocabulary is the top 8 ids (letters g..n)."""
    folder = tmp_path_factory.mktemp("gh")
    write_tiny_head(folder, letters[0], draft_vocab=8)
    return folder


def _spec(draft, shape: str) -> spec_config.SpeculationConfig:  # noqa: ANN001
    return spec_config.SpeculationConfig(spec_config.ProposerChoice(str(draft)), num_speculative_tokens=3,
                                         tree=TreeShape(budget=8, depth=3, top_k=2) if shape == "tree" else None,
                                         ssd=spec_config.SsdConfig(backup="neural") if shape == "ssd" else None)


def _banned(request, spec) -> int:  # noqa: ANN001
    """Tokens of a speculation its request's grammar bans where they stand."""
    rows = request.grammar.allowed(spec.paths())  # [n + 1, V]: after the root and after each node
    return sum(not rows[parent, token] for token, parent in zip(spec.tokens, spec.parent_list(), strict=True))


def test_constrain_bans_per_path_and_a_row_with_nothing_allowed_becomes_uniform_over_the_grammar(letters):
    state = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})).compile(Grammar("regex", "ab[c-e]"))
    a, b, c, d, e = 2, 3, 4, 5, 6
    logits = torch.zeros(3, 16)
    logits[2, :c] = 1.0  # finite only where the grammar bans (a draft with a trimmed vocabulary)
    logits[2, c:] = float("-inf")
    out = AnswerGrammar(state, [a]).constrain(logits, [[], [b], [b]])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [b]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [c, d, e]
    assert out[2].tolist() == out[1].tolist() and out[1, c] == 0.0  # uniform over c, d, e
    assert torch.isfinite(logits[2]).sum() == c  # the input is untouched


@pytest.mark.parametrize("shape", ["chain", "tree", "ssd"])
@pytest.mark.parametrize("draft", ["model", "eagle3"])
def test_the_draft_proposes_only_allowed_tokens_and_greedy_output_is_plain(letters, head, monkeypatch, shape, draft):
    plain = [o.token_ids for o in _llm(letters).generate(PROMPTS, PARAMS)]
    llm = _llm(letters, _spec(letters[1] if draft == "model" else head, shape))
    proposer = llm.engine.speculative_decoder.proposer
    real, seen = proposer.propose, []

    def checked(requests):  # noqa: ANN001, ANN202
        specs = real(requests)
        seen.extend(_banned(r, s) for r, s in zip(requests, specs, strict=True))
        return specs

    monkeypatch.setattr(proposer, "propose", checked)
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == plain
    assert seen and not any(seen)
    assert llm.engine.speculative_decoder.counters.num_accepted_tokens > 0


@pytest.mark.parametrize("shape", ["chain", "tree", "ssd"])
def test_a_draft_that_sees_the_grammar_needs_fewer_rounds(letters, monkeypatch, shape):
    """Splicing off, to see the draft alone: the blind draft guesses banned tokens and misses forced ones."""
    monkeypatch.setattr(speculative_decoder.SpeculativeDecoder, "_with_forced_tokens", lambda self, seq, s, k: s)
    plain = [o.token_ids for o in _llm(letters).generate(PROMPTS, PARAMS)]
    seeing = _llm(letters, _spec(letters[1], shape))
    assert [o.token_ids for o in seeing.generate(PROMPTS, PARAMS)] == plain
    monkeypatch.setattr(speculative_decoder, "AnswerGrammar", lambda *_: None)
    blind = _llm(letters, _spec(letters[1], shape))
    assert [o.token_ids for o in blind.generate(PROMPTS, PARAMS)] == plain
    assert seeing.engine.speculative_decoder.counters.num_drafts < blind.engine.speculative_decoder.counters.num_drafts


def test_ssd_sampling_with_a_grammar_matches_the_masked_target(letters):
    """SSD's cache, branches and backups drafted under the grammar (q masked, Saguaro-scaled): the answers are
    still the masked target's distribution."""
    exact = _exact(letters[2], GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})))
    spec = spec_config.SpeculationConfig(spec_config.ProposerChoice(str(letters[1])), num_speculative_tokens=2, k_schedule=((1024, 2),),
                                         ssd=spec_config.SsdConfig(saguaro_c=0.5))
    assert chi_square_pvalue(_samples(letters, spec), exact) > 0.001


def test_splicing_keeps_an_ssd_cache_hit_a_hit(letters):
    """The target's splicing changes what the draft answered from its cache; it still counts as a hit."""
    from types import SimpleNamespace

    from ssd.speculation.speculation import Speculation

    state = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})).compile(Grammar("regex", "abc[d-f]"))
    a, b, c, d = 2, 3, 4, 5
    spec = Speculation([a, d, c], cache_hit=True, predicted_hit=0.5)
    out = speculative_decoder.SpeculativeDecoder._with_forced_tokens(None, SimpleNamespace(grammar=state, output_token_ids=[]),
                                                             spec, 3)
    assert out.tokens == [a, b, c] and out.cache_hit and out.predicted_hit == 0.5


def test_warm_up_builds_the_tokenizer_index_once_whichever_thread_asks_first(letters, monkeypatch):
    import threading

    import llguidance

    built = []
    real = llguidance.LLTokenizer

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(llguidance, "LLTokenizer", counting)
    compiler = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS}))
    threads = [threading.Thread(target=compiler.warm_up) for _ in range(4)]
    for t in threads:
        t.start()
    compiler.compile(Grammar("regex", "ab"))
    for t in threads:
        t.join()
    assert built == [1]
