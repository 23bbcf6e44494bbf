"""One sequence on the draft side: all the draft keeps of it but its proposer's model state. Its owner (the draft
service's Session; in one process the OverlappedSpeculator) passes it to the SsdSpeculator with each request; its
contents change on the speculator's worker thread only, but for the token snapshot an in-process owner sets at each
propose (a new list: a queued build reads the old one). On the draft service it follows the outcomes (`commit`)."""

from dataclasses import dataclass, field

import torch

from ssd.config import DecodeMode
from ssd.sampling.grammar import AnswerGrammar, GrammarState
from ssd.speculation.draft_vocab import DraftVocab
from ssd.speculation.feature_log import FeatureLog
from ssd.speculation.round_outcome import RoundOutcome


@dataclass
class CachedSpeculation:
    tokens: list[int]  # K draft tokens after the key's bonus token
    q: torch.Tensor | None  # [K, Vd] float32 the (Saguaro-scaled) distributions they were drawn from, in `vocab`
    vocab: DraftVocab  # q's vocabulary: widened to the target's only when the speculation is returned


@dataclass
class DraftRecord:
    seq_id: int  # the id the proposer knows (service-unique on the draft service)
    token_ids: list[int]  # committed tokens (prompt + output)
    temperature: float  # draft sampling temperature
    generator: torch.Generator  # the draft's own random stream for this sequence
    features: FeatureLog = field(default_factory=FeatureLog)  # target features arrived, not yet proposed from
    mode: DecodeMode = DecodeMode.SD  # SSD: answered from the speculation cache
    grammar: GrammarState | None = None  # structured output: the draft's matcher of the sequence's grammar
    answer_start: int = 0  # where the answer starts in token_ids (the grammar follows the tokens from there)
    is_released: bool = False  # its owner let it go: a build still queued for it skips it
    # SSD: the last speculation returned, its outcome, and the cache built for the next round
    last_speculation: list[int] = field(default_factory=list)  # a chain
    last_hit: bool = False  # whether it came from the cache
    observed: bool = True  # whether a round has been observed since it (True: none awaits its outcome)
    outcome: tuple[int, int] | None = None  # (j accepted, bonus) of it: the cache key; None = the lookup misses
    cache: dict[tuple[int, int], CachedSpeculation] = field(default_factory=dict)  # (j, bonus) -> next speculation
    guesses: list[list[int]] = field(default_factory=list)  # [j] ranked bonus guesses (s_{j+1} excluded)
    predicted_hit: float | None = None  # the last build's estimate that the coming outcome hits its cache
    built: bool = False  # a build ran for it (its next glue feeds a round's tokens, not its whole prompt)

    @property
    def has_features(self) -> bool:
        """Whether every position but the last (its features come with its verify) has target features (a gap
        is never filled: the sequence then stays undraftable)."""
        return self.features.end >= max(1, len(self.token_ids) - 1)

    def answer_grammar(self) -> AnswerGrammar | None:
        return AnswerGrammar(self.grammar, self.token_ids[self.answer_start :]) if self.grammar is not None else None

    def commit(self, outcome: RoundOutcome) -> None:
        """The round's committed tokens replace everything past `num_committed_before` (then `observe`)."""
        before = outcome.num_committed_before
        if self.grammar is not None and before < len(self.token_ids):
            self.grammar = None  # its matcher cannot step back over dropped tokens: draft on without it
        del self.token_ids[before:]
        self.token_ids.extend(outcome.new_tokens)
        self.features.truncate(before)  # features past it were of dropped tokens
        self.observe(outcome)

    def observe(self, outcome: RoundOutcome) -> None:
        """Keep the cache key of the last speculation's outcome: (j accepted, bonus) when this is the first round
        since it and it verified that speculation as the draft returned it up to where it stopped, else none."""
        fresh = not self.observed and outcome.is_own_speculation
        self.outcome = (outcome.num_accepted, outcome.bonus_token) if fresh else None
        self.observed = True

    def answered(self, tokens: list[int], is_hit: bool) -> None:
        """A speculation was returned: it awaits its outcome, and the cache is to be built for it."""
        self.last_speculation, self.last_hit, self.outcome, self.observed = list(tokens), is_hit, None, False
        self.cache, self.guesses, self.predicted_hit = {}, [], None
