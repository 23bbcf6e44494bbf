"""Structured output (a JSON schema or a regex the answer must follow): the masks, the errors, and exactness:
greedy speculation with a grammar equals plain greedy decoding with it, and speculative sampling follows the
target's distribution restricted to the grammar (chi-square; a verifier that masks only the root row is caught)."""


import pytest
import torch

from ssd import config as spec_config
from ssd.config import TreeShape
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.sampling.grammar import Grammar, GrammarCompiler
from ssd.sampling.params import SamplingParams
from tests.letter_models import EOS, LETTERS
from tests.speculation.exact_distribution import chi_square_pvalue

REGEX = "[ce-k]h[e-k]?[h-k]"  # 3 or 4 letters; "h" is forced (spliced into chains); the draft proposes some others
PROMPT = [3, 7, 2, 9]
TEMP = 0.9
NUM_RUNS = 4000


def _text(ids: list[int]) -> str:
    return "".join(LETTERS[t - 2] for t in ids if t != EOS)


def test_rows_follow_the_path_and_a_banned_path_token_keeps_its_parents_mask(letters):
    state = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})).compile(Grammar("regex", "[a-c][a-e]?[b-d]"))
    a, b, c, d, e = 2, 3, 4, 5, 6
    rows = state.allowed([], [[], [a], [a, b], [a, e, b], [d], [d, a]])  # [6, 16]
    assert rows[0].nonzero().flatten().tolist() == [a, b, c]
    assert rows[1].nonzero().flatten().tolist() == [a, b, c, d, e]
    assert rows[2].nonzero().flatten().tolist() == [EOS, b, c, d]  # "ab" is complete: EOS or a third letter
    assert rows[3].nonzero().flatten().tolist() == [EOS]  # "aeb": only the end remains
    assert rows[4].equal(rows[0]) and rows[5].equal(rows[0])  # d is banned at the root: unreachable rows
    assert state.allowed([a], [[]])[0].equal(rows[1])  # the committed answer moves the root


def test_a_dead_end_ends_the_answer_instead_of_leaving_no_token():
    from ssd.sampling.grammar import GrammarState

    class DeadEnd:  # a matcher that allows nothing: every row would be -inf
        def try_consume_tokens(self, tokens):  # type: ignore[no-untyped-def]
            return len(tokens)

        def compute_bitmask(self) -> bytes:
            return bytes(4)  # 32 tokens, none allowed

        def rollback(self, n: int) -> None: ...

        def get_error(self) -> str:
            return ""

    rows = GrammarState(DeadEnd(), 16, frozenset({EOS}), Grammar("regex", "a")).allowed([3], [[], [4]])
    assert rows.nonzero().tolist() == [[0, EOS], [1, EOS]]


@pytest.mark.parametrize(("grammar", "message"), [
    (Grammar("json_schema", "{"), "not valid JSON"),
    (Grammar("json_schema", '"object"'), "must be a JSON object"),
    (Grammar("json_schema", "false"), "accepts nothing"),
    (Grammar("json_schema", '{"type": "integer", "minimum": 5, "maximum": 2}'), "Unsatisfiable"),
    (Grammar("json_schema", '{"type": "objectx"}'), "invalid json_schema"),
    (Grammar("regex", "[a-"), "invalid regex"),
    (Grammar("lark", 'start: "a" ('), "invalid lark"),
    (Grammar("lark", 'begin: "a"'), "invalid lark"),  # no start rule
])
def test_bad_grammars_are_invalid_requests(letters, grammar, message):
    compiler = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS}))
    with pytest.raises(InvalidRequestError, match=message):
        compiler.compile(grammar)


@pytest.mark.parametrize(("options", "message"), [
    ({"ignore_eos": True}, "ignore_eos"), ({"min_tokens": 2}, "min_tokens"),
])
def test_grammar_refuses_options_that_fight_it(options, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(grammar=Grammar("regex", "a+"), **options)
    with pytest.raises(InvalidRequestError, match="kind"):
        Grammar("yaml", "a: 1")  # type: ignore[arg-type]


def test_a_weights_only_checkpoint_refuses_a_grammar(models):
    llm = LLM(str(models[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    with pytest.raises(InvalidRequestError, match="tokenizer.json"):
        llm.generate([PROMPT], SamplingParams(grammar=Grammar("regex", "a+")))


def _llm(letters, speculation=None) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(str(letters[0]), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
               speculation=speculation)


@pytest.mark.parametrize("shape", ["chain", "tree", "ssd"])
def test_greedy_speculation_with_a_grammar_equals_plain(letters, shape):
    params = SamplingParams(max_tokens=24, grammar=Grammar("regex", "[a-n]{3,9}(b|c)"))
    prompts = [PROMPT, [5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13]]
    plain = [o.token_ids for o in _llm(letters).generate(prompts, params)]
    free = [o.token_ids for o in _llm(letters).generate(prompts, SamplingParams(max_tokens=24))]
    assert plain != free and all(4 <= len(_text(t)) <= 10 and t[-1] == EOS for t in plain)
    spec = spec_config.SpeculationConfig(spec_config.ProposerChoice(str(letters[1])), num_speculative_tokens=3,
                                         tree=TreeShape(budget=8, depth=3, top_k=2) if shape == "tree" else None,
                                         ssd=spec_config.SsdConfig() if shape == "ssd" else None)
    llm = _llm(letters, spec)
    assert [o.token_ids for o in llm.generate(prompts, params)] == plain
    assert llm.engine.speculative_decoder.counters.num_accepted_tokens > 0
    mixed = [params, SamplingParams(max_tokens=24), params]  # one batch: free text beside grammars
    assert [o.token_ids for o in llm.generate(prompts, mixed)] == [plain[0], free[1], plain[2]]


def test_a_lark_grammar_holds_the_answer_and_speculation_keeps_greedy_output(letters):
    lark = 'start: word " "? word\nword: /[a-f]+/ | "klm"'  # the letter tokenizer has no space: " " is banned
    params = SamplingParams(max_tokens=12, grammar=Grammar("lark", lark))
    prompts = [PROMPT, [5, 6, 7, 8, 5, 6]]
    plain = _llm(letters).generate(prompts, params)
    for out in plain:
        assert out.token_ids[-1] == EOS or out.finish_reason == "length"
        assert all(t in range(2, 8) or t in (12, 13, 14, EOS) for t in out.token_ids)  # a-f, k, l, m
    spec = spec_config.SpeculationConfig(spec_config.ProposerChoice(str(letters[1])), num_speculative_tokens=3)
    assert [o.token_ids for o in _llm(letters, spec).generate(prompts, params)] == [o.token_ids for o in plain]


def test_forced_tokens_are_spliced_into_the_chain(letters):
    state = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})).compile(
        Grammar("regex", "abc[d-f]gh[a-n]+"))
    a, b, c, d, e, f, g, h = range(2, 10)
    # forced a b c, then the draft's d (allowed), forced g h, then the draft would be needed again
    assert state.forced_chain([], [a, b, c, d, g, h, a], 8) == [(a, True), (b, True), (c, True), (d, True),
                                                                (g, True), (h, True), (a, True)]
    # the draft guessed x instead of b: b is spliced, and the draft's later tokens are dropped at d-f
    assert state.forced_chain([], [a, d, c, d], 8) == [(a, True), (b, False), (c, False)]
    assert state.forced_chain([], [a, b, c, d], 2) == [(a, True), (b, True)]  # the limit
    assert state.forced_chain([a, b, c], [g], 8) == [(g, True)]  # a banned draft token ends the chain
    assert state.forced_chain([a, b, c, e], [], 8) == [(g, False), (h, False)]  # no draft: the forced run


def test_a_tree_is_held_to_the_grammar_with_its_forced_tokens_spliced_in(letters):
    state = GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})).compile(
        Grammar("regex", "abc[d-f]gh[a-n]+"))
    a, b, c, d, e, f, g, h = range(2, 10)
    # root -> a -> b -> e, a -> c; root -> d (banned). Forced a, b, c: the draft's a and b are kept, c is spliced
    # (the draft had e below b), and the branches the grammar bans are dropped
    assert state.forced_tree([], [a, d, b, c, e], [0, 0, 1, 1, 3], 8) == ([a, b, c], [0, 1, 2])
    assert state.forced_tree([], [a, d, b, c, e], [0, 0, 1, 1, 3], 2) == ([a, b], [0, 1])  # the budget
    # after "abc": the draft's e (allowed) and a (banned) at the root; g, h forced below e (the draft had both)
    assert state.forced_tree([a, b, c], [e, a, g, h], [0, 0, 1, 3], 8) == ([e, g, h], [0, 1, 2])
    # forced runs continue below leaves, breadth first, until the budget
    assert state.forced_tree([a, b, c], [d, e, f], [0, 0, 0], 8) == ([d, e, f, g, g, g, h, h], [0, 0, 0, 1, 2, 3, 4, 5])


@pytest.mark.parametrize("shape", ["chain", "tree", "ssd"])
def test_splicing_accepts_the_forced_run_and_keeps_greedy_output(letters, monkeypatch, shape):
    from ssd.engine import speculative_decoder

    monkeypatch.setattr(speculative_decoder, "AnswerGrammar", lambda *_: None)  # a draft blind to the grammar
    params = SamplingParams(max_tokens=24, grammar=Grammar("regex", "[a-n]{2,4}(cdefghij|klm)[a-n]{2,4}"))
    prompts = [PROMPT, [5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13]]
    plain = [o.token_ids for o in _llm(letters).generate(prompts, params)]
    spec = spec_config.SpeculationConfig(spec_config.ProposerChoice(str(letters[1])), num_speculative_tokens=3,
                                         tree=TreeShape(budget=8, depth=3, top_k=2) if shape == "tree" else None,
                                         ssd=spec_config.SsdConfig() if shape == "ssd" else None)
    spliced = _llm(letters, spec)
    assert [o.token_ids for o in spliced.generate(prompts, params)] == plain
    monkeypatch.setattr(speculative_decoder.SpeculativeDecoder, "_with_forced_tokens", lambda self, seq, s, k: s)
    unspliced = _llm(letters, spec)
    assert [o.token_ids for o in unspliced.generate(prompts, params)] == plain
    done, undone = spliced.engine.speculative_decoder.counters, unspliced.engine.speculative_decoder.counters
    assert done.num_drafts < undone.num_drafts and done.num_accepted_tokens > undone.num_accepted_tokens


def _exact(hf, compiler: GrammarCompiler) -> dict[tuple, float]:
    """P(answer) for every answer of the regex (letters then EOS), by the target in float64 with the grammar's
    masks at each step."""
    done: dict[tuple, float] = {}
    frontier: dict[tuple, float] = {(): 1.0}
    while frontier:
        grown: dict[tuple, float] = {}
        for prefix, prob in frontier.items():
            with torch.no_grad():
                logits = hf(torch.tensor([PROMPT + list(prefix)])).logits[0, -1]  # [V]
            allowed = compiler.compile(Grammar("regex", REGEX)).allowed(list(prefix), [[]])[0]
            step = torch.softmax(logits.masked_fill(~allowed, float("-inf")) / TEMP, dim=-1)
            for t in allowed.nonzero().flatten().tolist():
                target = done if t == EOS else grown
                target[prefix + (t,)] = prob * float(step[t])
        frontier = grown
    return done


def _samples(letters, spec) -> list[tuple]:  # type: ignore[no-untyped-def]
    llm = _llm(letters, spec)
    grammar = Grammar("regex", REGEX)
    params = [SamplingParams(temperature=TEMP, max_tokens=8, seed=i, grammar=grammar) for i in range(NUM_RUNS)]
    outs = llm.generate([PROMPT] * NUM_RUNS, params)
    counters = llm.engine.speculative_decoder.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    return [tuple(o.token_ids) for o in outs]


def _spec(letters, tree: bool) -> spec_config.SpeculationConfig:  # type: ignore[no-untyped-def]
    return spec_config.SpeculationConfig(spec_config.ProposerChoice(str(letters[1])), num_speculative_tokens=2, k_schedule=((1024, 2),),
                                         tree=TreeShape(budget=6, depth=2, top_k=2) if tree else None)


@pytest.fixture(scope="module")
def exact(letters):  # noqa: ANN201
    return _exact(letters[2], GrammarCompiler(letters[0] / "tokenizer.json", 16, frozenset({EOS})))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_speculative_sampling_with_a_grammar_matches_the_masked_target(letters, exact, tree):
    samples = _samples(letters, _spec(letters, tree))
    assert all(t[-1] == EOS and 3 <= len(t) - 1 <= 4 and t[1] == 9 for t in samples)  # 9 = "h"
    assert chi_square_pvalue(samples, exact) > 0.001


def test_a_verifier_masking_only_the_root_row_is_caught(letters, monkeypatch):
    """The easy bug: the grammar applied at the committed position but not at the draft's positions. Banned
    draft tokens get accepted, and the engine stops at the first answer that left its grammar."""
    from ssd.sampling import grammar as grammar_module

    real = grammar_module.GrammarState.allowed

    def root_only(self, output_ids, paths):  # type: ignore[no-untyped-def]
        rows = real(self, output_ids, paths)
        return torch.cat([rows[:1], torch.ones_like(rows[1:])])

    monkeypatch.setattr(grammar_module.GrammarState, "allowed", root_only)
    with pytest.raises(RuntimeError, match="left its grammar"):
        _samples(letters, _spec(letters, False))
