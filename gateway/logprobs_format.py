"""Token logprobs from the target, in the two OpenAI response shapes.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.
Completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
The numbers are the target's raw distribution (before temperature, top-k, top-p), one entry per generated
token, including tokens whose text a stop string cut from the answer.
"""

from gateway.tokenizer import TextTokenizer
from protos.ssd.v1 import common_pb2


def _entry(tok: TextTokenizer, token_id: int, logprob: float) -> dict:
    text = tok.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tok: TextTokenizer, logprobs: list[common_pb2.TokenLogprob]) -> dict:
    content = []
    for lp in logprobs:
        top = [_entry(tok, t, v) for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)]
        content.append(_entry(tok, lp.token_id, lp.logprob) | {"top_logprobs": top})
    return {"content": content}


def completion_logprobs(tok: TextTokenizer, logprobs: list[common_pb2.TokenLogprob], text_offset: int = 0,
                        unscored_first: int | None = None) -> dict:
    """`text_offset`: characters of the answer before these tokens (streamed chunks continue the count).
    `unscored_first`: a token id to lead with, without a logprob (an echoed prompt's first token: null, as OpenAI)."""
    tokens, offsets = [], []
    ids = ([] if unscored_first is None else [unscored_first]) + [lp.token_id for lp in logprobs]
    for token_id in ids:
        offsets.append(text_offset)
        tokens.append(tok.token_text(token_id))
        text_offset += len(tokens[-1])
    lead = [None] if unscored_first is not None else []
    return {
        "tokens": tokens,
        "token_logprobs": lead + [lp.logprob for lp in logprobs],
        "top_logprobs": lead + [{tok.token_text(t): v for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)}
                                for lp in logprobs],
        "text_offset": offsets,
    }


def merged(first: dict, second: dict) -> dict:
    """Two completions logprobs dicts, one after the other (an echoed prompt's, then the answer's)."""
    return {key: first[key] + second[key] for key in first}
