"""Per-request changes to the target's logits before temperature, top-k and top-p: OpenAI's `logit_bias`, and
presence / frequency penalties, which lower the logit of every token the answer already holds (by
`presence_penalty` once and by `frequency_penalty` per occurrence; generated tokens only, not the prompt).

Applied wherever the target's distribution is needed: plain sampling and verification. A speculative round
scores each draft position with the answer as it would stand there (the committed tokens plus the path to that
node), so speculation stays exact with these on.
"""

import torch

from ssd.sampling.params import SamplingParams


def has_adjustments(params: SamplingParams) -> bool:
    return params.presence_penalty != 0 or params.frequency_penalty != 0 or bool(params.logit_bias)


def adjust_logits(
    logits: torch.Tensor,  # [n, V]
    output_ids: list[int],  # generated tokens before row 0
    paths: list[list[int]],  # [n]: tokens between the committed ones and row i's position (row 0: [])
    params: SamplingParams,
) -> torch.Tensor:  # [n, V] float32
    """Row i biased and penalized by the counts of output_ids + paths[i]; the logits themselves when the
    request asks for neither."""
    if not has_adjustments(params):
        return logits
    n, vocab = logits.shape
    out = logits.float()
    if params.logit_bias:
        ids, bias = zip(*params.logit_bias, strict=True)
        out = out.index_add(1, torch.tensor(ids, dtype=torch.long), torch.tensor(bias).expand(n, -1))
    if params.presence_penalty == 0 and params.frequency_penalty == 0:
        return out
    base = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab).float()  # [V]
    counts = base.expand(n, vocab).clone()  # [n, V]
    for i, path in enumerate(paths):
        if path:
            counts[i] += torch.bincount(torch.tensor(path, dtype=torch.long), minlength=vocab).float()
    return out - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
