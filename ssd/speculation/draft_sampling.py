"""How a proposer picks a draft token from its logits: argmax, or a draw from q at the draft temperature
(after masking what a structured-output grammar bans there)."""

import torch

from ssd.sampling.grammar import AnswerGrammar
from ssd.sampling.greedy import argmax_rows
from ssd.sampling.sampler import sample_from
from ssd.speculation.saguaro import SaguaroScale


def draft_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:  # [N, V] -> [N, V] float32
    return torch.softmax(logits.float() / temperature, dim=-1)


def pick_tokens(
    logits: torch.Tensor,  # [B, V]
    temperatures: list[float],
    generators: list[torch.Generator],
    scales: list[SaguaroScale | None] | None = None,
    step: int = 0,
) -> tuple[list[int], list[torch.Tensor | None]]:
    """One draft token per row and the q row it was drawn from (None when picked greedily); `scales` apply
    Saguaro scaling at chain step `step` (the returned q is the scaled one, as the verifier must see it)."""
    greedy = argmax_rows(logits).tolist()
    tokens: list[int] = []
    qs: list[torch.Tensor | None] = []
    for i, temp in enumerate(temperatures):
        if temp <= 0:
            tokens.append(greedy[i])
            qs.append(None)
            continue
        q = draft_probs(logits[i : i + 1], temp)[0]
        if scales is not None and scales[i] is not None:
            q = scales[i].apply(q, step)
        tokens.append(int(sample_from(q[None], generators[i])[0]))
        qs.append(q)
    return tokens, qs


def constrain_rows(logits: torch.Tensor, grammars: list[AnswerGrammar | None],
                   paths: list[list[int]]) -> torch.Tensor:
    """logits [B, V] with row i limited to what grammars[i] allows after paths[i] (rows without one unchanged)."""
    if all(g is None for g in grammars):
        return logits
    logits = logits.clone()
    for i, (grammar, path) in enumerate(zip(grammars, paths, strict=True)):
        if grammar is not None:
            logits[i] = grammar.constrain(logits[i : i + 1], [path])[0]
    return logits
