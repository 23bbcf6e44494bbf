"""The proposer interface: anything that can guess a sequence's next tokens.

The engine calls, per decode round, `propose` for the batch, verifies, then `observe` once for each live
sequence with the round's outcome as the verifier counted it (ssd/speculation/round_outcome.py); `release`
when a sequence ends. `catch_up` brings a draft up to the committed tokens without proposing. Where the draft
works beside the target (`feeds_in_background`: the SSD speculator on its worker, a remote draft) the engine calls
it after each plain step of mode auto, so the draft keeps up while it would idle instead of catching up on the
critical path when speculation resumes; elsewhere it would only move a proposal's catch-up onto that path. While
such a draft is still prefilling the prompts a catch-up brought it (`catching_up`), mode auto takes plain steps: a
speculative round would wait for it. A proposer keeps only model state (a draft model its own paged KV) and rolls
it back by the outcome's length.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from ssd.config import DecodeMode, TreeShape
from ssd.sampling.grammar import AnswerGrammar
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.saguaro import SaguaroScale
from ssd.speculation.speculation import Speculation


@dataclass(frozen=True)
class ProposeRequest:
    seq_id: int
    token_ids: list[int]  # every committed token (prompt + output); the last one has no KV yet
    num_tokens: int  # lookahead K: draft tokens wanted (a chain) or the depth limit (a tree)
    temperature: float  # draft sampling temperature; 0 = greedy draft (no q is returned)
    generator: torch.Generator  # the sequence's own random stream
    tree: TreeShape | None = None  # None = a chain
    # [n, F] target features of committed positions not sent before; on CPU or the target's device
    features: torch.Tensor | None = None
    features_start: int = 0  # the position of the first row of `features`
    saguaro: SaguaroScale | None = None  # SSD: scale the draft's top probabilities before sampling (and in q)
    mode: DecodeMode = DecodeMode.SD  # SD or SSD (a remote draft answers SSD from its speculation cache)
    grammar: AnswerGrammar | None = None  # structured output: propose only what the grammar allows (speed only)
    num_cached_tokens: int = 0  # leading prompt tokens the target's prefix cache served (whole blocks)
    sd_round: bool = False  # SSD: speculate as plain SD this round (drafted now, no cache built; mode auto's choice)


class Proposer(Protocol):
    """Proposes speculations; needs the target's aux features of `feature_layers` (empty for most)."""

    feature_layers: tuple[int, ...]
    feeds_in_background: bool  # whether `catch_up` returns at once while the draft works beside the caller
    catching_up: bool  # whether such a draft is still prefilling prompts `catch_up` brought it (a round would wait)

    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]: ...

    def observe(self, seq_id: int, outcome: RoundOutcome) -> None:
        """What the round committed (one call per round per live sequence); anything past it was speculative.
        A sequence the proposer never saw is ignored."""
        ...

    def catch_up(self, requests: list[ProposeRequest]) -> None:
        """Bring the draft's state up to each request's committed tokens but the last (and its features), proposing
        nothing (`num_tokens` is ignored). A proposer without such state does nothing."""
        ...

    def release(self, seq_id: int) -> None: ...
