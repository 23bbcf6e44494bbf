"""Per-request changes to the target's logits before temperature, top-k, top-p and min-p: OpenAI's `logit_bias`
and presence / frequency penalties (lower the logit of every token the answer already holds, by
`presence_penalty` once and by `frequency_penalty` per occurrence; generated tokens only, not the prompt), and
the vLLM / HF extensions `repetition_penalty` (a token seen in the prompt or the answer has its logit divided by
the penalty when positive, multiplied when negative) and `min_tokens` (the tokens that would end the answer are
banned until it holds that many), and structured output (tokens the request's grammar bans there get -inf,
ssd/sampling/grammar.py).

Applied wherever the target's distribution is needed: plain sampling and verification. A speculative round
scores each draft position with the answer as it would stand there (the committed tokens plus the path to that
node), so speculation stays exact with these on.
"""

from collections.abc import Sequence

import torch

from ssd.sampling.grammar import GrammarState
from ssd.sampling.params import SamplingParams


def has_adjustments(params: SamplingParams) -> bool:
    return (params.presence_penalty != 0 or params.frequency_penalty != 0 or bool(params.logit_bias)
            or params.repetition_penalty != 1.0 or params.min_tokens > 0 or params.grammar is not None)


def _path_counts(output_ids: list[int], paths: list[list[int]], vocab: int) -> torch.Tensor:  # [n, V]
    """Occurrences of each token in the answer as it stands at row i: output_ids + paths[i]."""
    base = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab).float()  # [V]
    counts = base.expand(len(paths), vocab).clone()  # [n, V]
    for i, path in enumerate(paths):
        if path:
            counts[i] += torch.bincount(torch.tensor(path, dtype=torch.long), minlength=vocab).float()
    return counts


def adjust_logits(
    logits: torch.Tensor,  # [n, V]
    output_ids: list[int],  # generated tokens before row 0
    paths: list[list[int]],  # [n]: tokens between the committed ones and row i's position (row 0: [])
    params: SamplingParams,
    prompt_ids: Sequence[int] = (),  # for repetition_penalty
    stop_ids: frozenset[int] = frozenset(),  # tokens that end the answer (EOS, stop ids), for min_tokens
    grammar: GrammarState | None = None,  # the request's compiled params.grammar
) -> torch.Tensor:  # [n, V] float32
    """Row i biased, penalized, (below min_tokens) barred from ending and held to the grammar, for the answer
    output_ids + paths[i]; the logits themselves when the request asks for none of it."""
    if not has_adjustments(params):
        return logits
    n, vocab = logits.shape
    out = logits.float()  # may be `logits` itself: every step below makes a new tensor
    penalizes_counts = params.presence_penalty != 0 or params.frequency_penalty != 0
    counts = _path_counts(output_ids, paths, vocab) if penalizes_counts or params.repetition_penalty != 1.0 else None
    if params.repetition_penalty != 1.0:
        seen = counts > 0  # [n, V]
        seen[:, torch.tensor(sorted(set(prompt_ids)), dtype=torch.long)] = True
        penalized = torch.where(out > 0, out / params.repetition_penalty, out * params.repetition_penalty)
        out = torch.where(seen, penalized, out)
    if params.logit_bias:
        ids, bias = zip(*params.logit_bias, strict=True)
        out = out.index_add(1, torch.tensor(ids, dtype=torch.long), torch.tensor(bias).expand(n, -1))
    if penalizes_counts:
        out = out - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
    if params.min_tokens > len(output_ids) and stop_ids:
        short = torch.tensor([len(output_ids) + len(p) < params.min_tokens for p in paths])  # [n]
        banned = torch.tensor(sorted(stop_ids), dtype=torch.long)
        out = out.masked_fill(short[:, None] & torch.isin(torch.arange(vocab), banned)[None, :], float("-inf"))
    if grammar is not None:
        out = out.masked_fill(~grammar.allowed(output_ids, paths), float("-inf"))
    return out
