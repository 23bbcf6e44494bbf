"""Structured output: constrain a request's answer to a JSON schema, a regular expression or a Lark grammar.

A `Grammar` (in SamplingParams) is compiled once per request into a `GrammarState`, which follows the answer's
committed tokens and tells, for any row of a forward, which tokens may come next there: the answer as it
stands (row 0) or as it would stand after a draft path (rows of a speculation). Banned tokens get -inf logits
wherever the target's distribution is formed (plain sampling and verification), so the answer is the target's
distribution restricted to the grammar, and speculation stays exact: a draft token the grammar bans has p = 0
and is never accepted. When the grammar is complete only the end-of-sequence tokens remain allowed.

Proposers see the grammar too (`AnswerGrammar`, in each ProposeRequest): a draft that only proposes allowed
tokens drafts the forced ones itself and never wastes a position on a banned one. That is a matter of speed
only: the target's masking alone keeps the answer exact, whatever the draft proposes.

Token masks come from llguidance (a Rust matcher over the tokenizer's vocabulary, ~0.1 ms per token here).
"""

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
import torch

from ssd.errors import InvalidRequestError

log = structlog.get_logger(__name__)

GrammarKind = Literal["json_schema", "regex", "lark"]
GRAMMAR_KINDS = ("json_schema", "regex", "lark")
MAX_GRAMMAR_CHARS = 65536  # a request's schema or regex text at most
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's response_format {"type": "json_object"}
# A JSON answer written the way the model writes JSON anyway: one space after ':' and ','; no free whitespace
# (with it a small model can pad an answer with newlines until max_tokens).
_JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class Grammar:
    # "json_schema": source is a JSON schema (JSON text); "regex": the whole answer matches it; "lark": a
    # context-free grammar in llguidance's Lark dialect (rule `start`; may embed %json {schema} and /regex/)
    kind: GrammarKind
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
    """One request's matcher. Every call names the committed answer; the state follows it (no commit hook).
    Masks are memoized per path until the answer grows, so the verify's rows reuse the splicing's."""

    def __init__(self, matcher, vocab: int, eos_ids: frozenset[int],  # noqa: ANN001 (llguidance.LLMatcher)
                 grammar: Grammar) -> None:
        self.grammar = grammar  # the source it was compiled from (a remote draft compiles it again)
        self._matcher = matcher
        self._vocab = vocab
        self._eos = eos_ids
        self._consumed = 0  # answer tokens the matcher has consumed
        self._masks: dict[tuple[int, ...], torch.Tensor] = {}  # path after the answer -> [V] bool

    def copy(self) -> "GrammarState":
        """An independent matcher at the same point of the answer, for another thread (a draft that builds while
        the target verifies follows the answer on a matcher of its own)."""
        twin = GrammarState(self._matcher.deep_copy(), self._vocab, self._eos, self.grammar)
        twin._consumed = self._consumed
        return twin

    def _sync(self, output_ids: list[int]) -> None:
        new = output_ids[self._consumed :]
        if not new:
            return
        if self._matcher.try_consume_tokens(new) != len(new):
            # cannot happen: every committed token was allowed when it was chosen
            raise RuntimeError(f"the answer left its grammar: {self._matcher.get_error()}")
        self._consumed = len(output_ids)
        self._masks.clear()

    def _mask_after(self, path: list[int]) -> torch.Tensor:  # [V] bool
        """The tokens allowed after the answer + path; a path that leaves the grammar gets the mask where it
        left (its rows are unreachable: the banned token has p = 0 at its parent)."""
        consumed = self._matcher.try_consume_tokens(path) if path else 0
        key = tuple(path[:consumed])
        mask = self._masks.get(key)
        if mask is None:
            mask = _bits(self._matcher.compute_bitmask(), self._vocab)
            if not mask.any():  # a dead end (should not happen: llguidance keeps the grammar satisfiable)
                log.warning("grammar allows no token; ending the answer", error=self._matcher.get_error())
                mask[sorted(self._eos)] = True
            self._masks[key] = mask
        if consumed:
            self._matcher.rollback(consumed)
        return mask

    def _forced(self, mask: torch.Tensor) -> int | None:
        """The one token the mask allows, unless that is the end of the sequence (the verify's bonus then)."""
        allowed = mask.nonzero().flatten()  # [m]
        return int(allowed[0]) if len(allowed) == 1 and int(allowed[0]) not in self._eos else None

    def allowed(self, output_ids: list[int], paths: list[list[int]]) -> torch.Tensor:  # [n, V] bool
        """Row i: the tokens the grammar allows after output_ids + paths[i]."""
        self._sync(output_ids)
        return torch.stack([self._mask_after(path) for path in paths])

    def forced_chain(self, output_ids: list[int], draft: list[int], limit: int) -> list[tuple[int, bool]]:
        """A chain speculation with the grammar's forced tokens spliced in: walking from the committed answer,
        a position where the grammar allows exactly one token gets that token (the target's masked p is 1
        there, so it is always accepted); elsewhere the draft's token, as long as every earlier position holds
        the draft's own token (a token drafted after a different one is not a sample of its q row). Stops
        where only EOS may follow (the verify's bonus), after a banned draft token (kept: with a q row its
        rejection shapes the bonus token's distribution) or at `limit` tokens. [(token, the draft's own)]."""
        self._sync(output_ids)
        chain: list[tuple[int, bool]] = []
        diverged = False
        while len(chain) < limit:
            i, mask = len(chain), self._mask_after([t for t, _ in chain])
            forced = self._forced(mask)
            if forced is not None:
                token, own = forced, not diverged and i < len(draft) and draft[i] == forced
                diverged = diverged or not own
            elif diverged or i >= len(draft) or mask.sum() == 1:  # the draft's turn, or only EOS may follow
                break
            else:
                token, own = draft[i], True
            chain.append((token, own))
            if not mask[token]:
                break
        return chain

    def forced_tree(self, output_ids: list[int], tokens: list[int], parents: list[int],
                    budget: int) -> tuple[list[int], list[int]]:
        """A token tree (one-hot proposals) held to the grammar, breadth first: below a node where the grammar
        forces the next token, that token alone (with the draft's subtree under it when the draft had it);
        elsewhere the draft's children that the grammar allows (a banned one-hot candidate is rejected with
        certainty, so dropping it changes nothing). At most `budget` nodes; (tokens, parents), node i + 1's
        parent is parents[i] (0 = root)."""
        self._sync(output_ids)
        children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
        for node, parent in enumerate(parents, start=1):
            children[parent].append(node)
        new_tokens: list[int] = []
        new_parents: list[int] = []
        paths: list[list[int]] = [[]]  # per new node (0 = root): its tokens from the root
        queue = [(0, 0)]  # (node of the draft's tree or -1, node of the new tree)
        for old, new in queue:  # the list grows while it is walked: breadth first
            mask = self._mask_after(paths[new])
            forced = self._forced(mask)
            draft_kids = children[old] if old >= 0 else []
            if forced is not None:
                picks = [(next((c for c in draft_kids if tokens[c - 1] == forced), -1), forced)]
            else:
                picks = [(c, tokens[c - 1]) for c in draft_kids if mask[tokens[c - 1]]]
            for old_child, token in picks:
                if len(new_tokens) == budget:
                    break
                new_tokens.append(token)
                new_parents.append(new)
                paths.append([*paths[new], token])
                queue.append((old_child, len(new_tokens)))
        return new_tokens, new_parents


@dataclass(frozen=True)
class AnswerGrammar:
    """A request's grammar where its answer stands, as a proposer sees it: which tokens may follow the answer
    and then a draft path."""

    state: GrammarState
    output_ids: list[int]  # the committed answer (the prompt excluded)

    def allowed(self, paths: list[list[int]]) -> torch.Tensor:  # [n, V] bool
        return self.state.allowed(self.output_ids, paths)

    def constrain(self, logits: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """logits [n, V] with -inf where row i's path may not go on; a new tensor. A row whose finite logits are
        all banned (a draft with a trimmed vocabulary) becomes uniform over the allowed tokens."""
        allowed = self.allowed(paths).to(logits.device)  # [n, V]
        out = logits.masked_fill(~allowed, float("-inf"))
        stuck = torch.isneginf(out).all(dim=-1)  # [n]
        if stuck.any():
            out[stuck] = torch.zeros_like(out[stuck]).masked_fill(~allowed[stuck], float("-inf"))
        return out


class GrammarCompiler:
    """Builds matchers for one tokenizer; the tokenizer index (~0.3 s) is made on the first grammar, or ahead of
    it by `warm_up` (a service calls it in a thread at start, so the first grammar does not stall its batch)."""

    def __init__(self, tokenizer_json: Path, vocab: int, eos_ids: frozenset[int]) -> None:
        self._path = tokenizer_json
        self._vocab = vocab
        self._eos = sorted(eos_ids)
        self._tokenizer = None
        self._lock = threading.Lock()  # one index, whichever thread asks first

    def _llg_tokenizer(self):  # noqa: ANN202
        with self._lock:
            if self._tokenizer is None:
                import llguidance  # a Rust extension; imported when the first grammar arrives

                self._tokenizer = llguidance.LLTokenizer(str(self._path), n_vocab=self._vocab, eos_token=self._eos)
                log.info("grammar tokenizer ready", vocab=self._vocab, eos=self._eos)
            return self._tokenizer

    def warm_up(self) -> None:
        """Build the tokenizer index now instead of on the first grammar."""
        self._llg_tokenizer()

    def compile(self, grammar: Grammar) -> GrammarState:
        """InvalidRequestError when the schema or regex is not one llguidance accepts."""
        import llguidance

        if grammar.kind == "json_schema":
            try:
                schema = json.loads(grammar.source)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {e}") from e
            if schema is False or not isinstance(schema, dict | bool):
                raise InvalidRequestError("a JSON schema must be a JSON object or true (false accepts nothing)")
            schema = {} if schema is True else schema
            try:
                text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_LAYOUT)
            except (ValueError, TypeError) as e:
                raise InvalidRequestError(f"unsupported JSON schema: {e}") from e
        elif grammar.kind == "regex":
            text = llguidance.LLMatcher.grammar_from_regex(grammar.source)
        else:
            text = llguidance.LLMatcher.grammar_from_lark(grammar.source)
        tokenizer = self._llg_tokenizer()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, tokenizer)
        if is_error:
            raise InvalidRequestError(f"invalid {grammar.kind}: {messages[0] if messages else 'rejected'}")
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {grammar.kind}: {matcher.get_error()}")
        return GrammarState(matcher, self._vocab, frozenset(self._eos), grammar)
