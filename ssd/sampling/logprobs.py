"""Per-token log-probabilities a request can ask for (OpenAI `logprobs` / `top_logprobs`).

They are the target model's own distribution at each generated position: log-softmax of the raw logits, before
temperature, top-k or top-p (what vLLM returns by default). Speculative decoding gives the same numbers as plain
decoding (in float32; bfloat16 rounds a K+1-token forward slightly differently): the verify forward scores every
emitted token at its parent position, exactly where a decode step would.
"""

from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # as in the OpenAI API


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the most likely (token id, logprob) pairs, most likely first


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """logits [n, V] (row i: the distribution token_ids[i] was drawn from) -> one TokenLogprob per token."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
    chosen = logp.gather(-1, torch.tensor(token_ids, dtype=torch.long)[:, None])[:, 0].tolist()  # [n]
    if num_top:
        values, ids = logp.topk(num_top, dim=-1)  # [n, num_top]
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [()] * len(token_ids)
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(token_ids, chosen, tops, strict=True)]


PROMPT_ROWS_PER_CHUNK = 256  # bounds the float32 log-softmax temporaries of a long prompt


def prompt_token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """`token_logprobs` for a whole prompt's rows (logits [n, V], row i scoring token_ids[i]), chunk by chunk."""
    out: list[TokenLogprob] = []
    for start in range(0, len(token_ids), PROMPT_ROWS_PER_CHUNK):
        end = start + PROMPT_ROWS_PER_CHUNK
        out.extend(token_logprobs(logits[start:end], token_ids[start:end], num_top))
    return out
