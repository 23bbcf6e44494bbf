"""The soak's request mix: one client loop of mixed OpenAI chat requests, each counted by what it should get.

Kinds (weights in MIX): streamed and whole answers in modes ar / sd / ssd, structured output (a JSON schema as
`response_format`), streams the client leaves after a second (cancels), bad requests (a 4xx is the right answer)
and requests with a deadline too short to finish (a 504 is the right answer). A client that gave up waiting
counts as `client_timeout` (queueing, reported apart); anything else counts as unexpected.
"""

import random
import threading
from collections import Counter

import openai

from bench.chaos import MODEL, PROMPTS, StreamResult, client, run_stream

MIX = {"stream": 30, "whole": 25, "json": 10, "cancel": 10, "bad": 15, "deadline": 10}  # relative weights
MODES = ["ar", "sd", "ssd"]
CLIENT_TIMEOUT_S = 300.0  # at concurrency 32 on 2 cores a request may queue for minutes
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
BAD_BODIES = [{"max_tokens": -1}, {"max_tokens": 2**40}, {"temperature": -1.0}, {"top_k": 2**40},
              {"mode": "warp"}, {"seed": 2**70}, {"logit_bias": {"999999999": 1}}, {"top_p": 2.0}]


def _status(e: openai.OpenAIError) -> int | None:
    return getattr(e, "status_code", None)


def _chat(c: openai.OpenAI, prompt: str, max_tokens: int, **extra: object) -> None:
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                              temperature=0, **extra)


def one_request(url: str, c: openai.OpenAI, rng: random.Random, counts: Counter) -> None:
    """Send one request of a kind drawn from MIX; count `kind:ok` or `kind:unexpected[:status]`."""
    kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    prompt, max_tokens, mode = rng.choice(PROMPTS), rng.randint(8, 96), rng.choice(MODES)
    if kind in ("stream", "cancel"):
        r = StreamResult()
        cancel = kind == "cancel"  # the client goes away after ~1 s of a long stream
        run_stream(client(url, timeout_s=1.0) if cancel else c, prompt, 400 if cancel else max_tokens, r, mode)
        ok = cancel or r.error is None
        outcome = "client_timeout" if r.error == "APITimeoutError" else f"unexpected:{r.error}"
        counts[f"{kind}:{mode}:ok" if ok else f"{kind}:{mode}:{outcome}"] += 1
        return
    try:
        if kind == "whole":
            _chat(c, prompt, max_tokens, extra_body={"mode": mode})
        elif kind == "json":
            _chat(c, "Give a person as JSON.", 48, extra_body={"mode": mode},
                  response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
        elif kind == "bad":
            _chat(c, prompt, 8, extra_body=rng.choice(BAD_BODIES))
        else:  # deadline: 50 ms for up to 300 tokens cannot finish
            _chat(c, prompt, 300, extra_body={"mode": mode, "timeout": 0.05})
    except openai.APIStatusError as e:
        expected = (kind == "bad" and 400 <= e.status_code < 500) or (kind == "deadline" and e.status_code == 504)
        counts[f"{kind}:ok" if expected else f"{kind}:unexpected:{e.status_code}"] += 1
        return
    except openai.APITimeoutError:  # the client gave up waiting (queueing at this concurrency), not a server error
        counts[f"{kind}:client_timeout"] += 1
        return
    except openai.OpenAIError as e:
        counts[f"{kind}:unexpected:{type(e).__name__}"] += 1
        return
    ok = kind in ("whole", "json")
    counts[f"{kind}:{mode}:ok" if ok else f"{kind}:unexpected:200"] += 1


def traffic(url: str, stop: threading.Event, counts: Counter, seed: int) -> None:
    """One client's loop of mixed requests until `stop`; `counts` is this client's own (sum them after)."""
    rng = random.Random(seed)
    c = client(url, timeout_s=CLIENT_TIMEOUT_S)
    while not stop.is_set():
        one_request(url, c, rng, counts)
