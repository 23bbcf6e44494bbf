"""Structured output: constrain a request's answer to a JSON schema or a regular expression.

A `Grammar` (in SamplingParams) is compiled once per request into a `GrammarState`, which follows the answer's
committed tokens and tells, for any row of a forward, which tokens may come next there: the answer as it
stands (row 0) or as it would stand after a draft path (rows of a speculation). Banned tokens get -inf logits
wherever the target's distribution is formed (plain sampling and verification), so the answer is the target's
distribution restricted to the grammar, and speculation stays exact: a draft token the grammar bans has p = 0
and is never accepted. When the grammar is complete only the end-of-sequence tokens remain allowed.

Token masks come from llguidance (a Rust matcher over the tokenizer's vocabulary, ~0.1 ms per token here).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
import torch

from ssd.errors import InvalidRequestError

log = structlog.get_logger(__name__)

GrammarKind = Literal["json_schema", "regex"]
GRAMMAR_KINDS = ("json_schema", "regex")
MAX_GRAMMAR_CHARS = 65536  # a request's schema or regex text at most
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's response_format {"type": "json_object"}
# A JSON answer written the way the model writes JSON anyway: one space after ':' and ','; no free whitespace
# (with it a small model can pad an answer with newlines until max_tokens).
_JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class Grammar:
    kind: GrammarKind  # "json_schema": source is a JSON schema (JSON text); "regex": the whole answer matches it
    source: str

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise InvalidRequestError(f"grammar kind must be one of {GRAMMAR_KINDS}, got {self.kind!r}")
        if not isinstance(self.source, str) or not self.source:
            raise InvalidRequestError(f"a {self.kind} grammar needs a non-empty text")
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(f"the {self.kind} is {len(self.source)} characters; at most {MAX_GRAMMAR_CHARS}")


def _bits(bitmask: bytes, vocab: int) -> torch.Tensor:  # [vocab] bool
    words = torch.frombuffer(bytearray(bitmask), dtype=torch.int32)  # [ceil(V / 32)]
    shifts = torch.arange(32, dtype=torch.int32)
    return ((words[:, None] >> shifts) & 1).flatten()[:vocab].bool()


class GrammarState:
    """One request's matcher. `allowed` syncs it to the committed answer first, so it needs no commit hook."""

    def __init__(self, matcher, vocab: int) -> None:  # noqa: ANN001 (llguidance.LLMatcher)
        self._matcher = matcher
        self._vocab = vocab
        self._consumed = 0  # answer tokens the matcher has consumed

    def _sync(self, output_ids: list[int]) -> None:
        new = output_ids[self._consumed :]
        if new and self._matcher.try_consume_tokens(new) != len(new):
            # cannot happen: every committed token was allowed when it was chosen
            raise RuntimeError(f"the answer left its grammar: {self._matcher.get_error()}")
        self._consumed = len(output_ids)

    def _mask(self) -> torch.Tensor:  # [V] bool
        return _bits(self._matcher.compute_bitmask(), self._vocab)

    def allowed(self, output_ids: list[int], paths: list[list[int]]) -> torch.Tensor:  # [n, V] bool
        """Row i: the tokens the grammar allows after output_ids + paths[i]. A row whose path leaves the grammar
        is unreachable (the banned draft token has p = 0 at its parent row), so it gets its parent's mask."""
        self._sync(output_ids)
        rows = []
        for path in paths:
            consumed = self._matcher.try_consume_tokens(path) if path else 0
            rows.append(self._mask())
            if consumed:
                self._matcher.rollback(consumed)
        return torch.stack(rows)

    def forced_chain(self, output_ids: list[int], draft: list[int], limit: int) -> list[tuple[int, bool]]:
        """A chain speculation with the grammar's forced tokens spliced in: walking from the committed answer,
        a position where the grammar allows exactly one token gets that token (the target's masked p is 1
        there, so it is always accepted); elsewhere the draft's token, as long as every earlier position holds
        the draft's own token (a token drafted after a different one is not a sample of its q row). Stops
        where the grammar is complete (only EOS may follow: the verify's bonus token), after a banned draft
        token (rejected by the verify) or at `limit` tokens. [(token, whether it is the draft's own)]."""
        self._sync(output_ids)
        chain: list[tuple[int, bool]] = []
        consumed, diverged = 0, False
        while len(chain) < limit and not self._matcher.is_stopped():
            allowed = self._mask().nonzero().flatten()  # [m]
            i = len(chain)
            if len(allowed) == 1:
                token = int(allowed[0])
                own = not diverged and i < len(draft) and draft[i] == token
                diverged = diverged or not own
            elif diverged or i >= len(draft):
                break
            else:
                token, own = draft[i], True
            chain.append((token, own))
            if self._matcher.try_consume_tokens([token]) != 1:
                break
            consumed += 1
        if consumed:
            self._matcher.rollback(consumed)
        return chain

    def is_complete(self, output_ids: list[int]) -> bool:
        """The answer satisfies the grammar and nothing may follow but the end of the sequence."""
        self._sync(output_ids)
        return self._matcher.is_stopped()


class GrammarCompiler:
    """Builds matchers for one tokenizer; the tokenizer index (~0.3 s) is made on the first grammar."""

    def __init__(self, tokenizer_json: Path, vocab: int, eos_ids: frozenset[int]) -> None:
        self._path = tokenizer_json
        self._vocab = vocab
        self._eos = sorted(eos_ids)
        self._tokenizer = None

    def _llg_tokenizer(self):  # noqa: ANN202
        if self._tokenizer is None:
            import llguidance  # a Rust extension; imported when the first grammar arrives

            self._tokenizer = llguidance.LLTokenizer(str(self._path), n_vocab=self._vocab, eos_token=self._eos)
            log.info("grammar tokenizer ready", vocab=self._vocab, eos=self._eos)
        return self._tokenizer

    def compile(self, grammar: Grammar) -> GrammarState:
        """InvalidRequestError when the schema or regex is not one llguidance accepts."""
        import llguidance

        if grammar.kind == "json_schema":
            try:
                schema = json.loads(grammar.source)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {e}") from e
            if not isinstance(schema, dict | bool):
                raise InvalidRequestError("a JSON schema must be a JSON object (or true / false)")
            try:
                text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_LAYOUT)
            except (ValueError, TypeError) as e:
                raise InvalidRequestError(f"unsupported JSON schema: {e}") from e
        else:
            text = llguidance.LLMatcher.grammar_from_regex(grammar.source)
        tokenizer = self._llg_tokenizer()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, tokenizer)
        if is_error:
            raise InvalidRequestError(f"invalid {grammar.kind}: {messages[0] if messages else 'rejected'}")
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {grammar.kind}: {matcher.get_error()}")
        return GrammarState(matcher, self._vocab)
