"""`ssd bench --against URL`: the benchmark prompts sent to any OpenAI-compatible server over HTTP.

Prompts are rendered here exactly as the in-process run renders them (chat template applied
locally) and sent as raw text to /v1/completions: streaming, greedy, max_tokens = output_len, and
`ignore_eos` (honoured by servers that support it, e.g. vLLM). The OpenAI API returns text, not
token ids, so the identity check is `outputs_text_sha256`: a hash of the texts, which the in-process
run reports too; `num_stopped_early` counts answers that ended before output_len (EOS honoured),
whose hashes cannot match an ignore_eos in-process run.
"""

import hashlib
import json
import time
from dataclasses import asdict, dataclass

from bench.datasets import Prompt


@dataclass(frozen=True)
class AgainstSettings:
    url: str  # server base URL, e.g. http://127.0.0.1:8000 (the /v1 suffix is added)
    model: str | None  # model name sent to the server; None = its first listed model
    api_key: str
    output_len: int
    temperature: float
    mode: str | None = None  # our gateway's `mode` extension (ar | sd); None = the server default


@dataclass(frozen=True)
class StreamTiming:
    text: str
    num_tokens: int  # completion tokens as the server counts them (usage), else the number of chunks
    ttft_s: float
    total_s: float


def texts_sha256(texts: list[str]) -> str:
    """The hash both the in-process and the HTTP runs report as outputs_text_sha256."""
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def render_texts(model: str, prompts: list[Prompt]) -> list[str]:
    """The prompt texts the in-process run encodes (chat template applied to chat prompts)."""
    from ssd.model_store import resolve_model
    from ssd.tokenizer import Tokenizer

    tokenizer = Tokenizer(resolve_model(model))
    return [tokenizer.apply_chat_template([{"role": "user", "content": p.text}]) if p.is_chat else p.text
            for p in prompts]


def _stream_one(client, s: AgainstSettings, model: str, prompt: str) -> StreamTiming:  # noqa: ANN001
    extra = {"ignore_eos": True, **({"mode": s.mode} if s.mode else {})}
    start = time.perf_counter()
    first, pieces, num_tokens = None, [], None
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=s.output_len,
                                       temperature=s.temperature, stream=True,
                                       stream_options={"include_usage": True}, extra_body=extra)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter()
            pieces.append(chunk.choices[0].text)
        if chunk.usage is not None:
            num_tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return StreamTiming("".join(pieces), num_tokens or len(pieces), (first or end) - start, end - start)


def run_against(s: AgainstSettings, texts: list[str], warmup: int = 1) -> dict:
    """One prompt at a time (batch 1); warm-up prompts are sent first and not timed."""
    from openai import OpenAI

    client = OpenAI(base_url=s.url.rstrip("/") + "/v1", api_key=s.api_key, max_retries=0, timeout=600)
    model = s.model or client.models.list().data[0].id
    for text in texts[:warmup]:
        _stream_one(client, s, model, text)
    timings = [_stream_one(client, s, model, text) for text in texts]
    decode_tokens = sum(max(t.num_tokens - 1, 0) for t in timings)
    decode_s = sum(t.total_s - t.ttft_s for t in timings)
    total_s = sum(t.total_s for t in timings)
    num_out = sum(t.num_tokens for t in timings)
    return {
        **asdict(s), "api_key": None, "mode": f"against:{s.mode or 'default'}", "served_model": model,
        "batch": 1, "num_prompts": len(texts), "output_tokens": num_out,
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        "ttft_s": sum(t.ttft_s for t in timings) / len(timings),
        "total_tok_s": num_out / total_s if total_s > 0 else 0.0, "total_s": total_s,
        "tokens_per_round": None, "accept_rate": None,
        "outputs_text_sha256": texts_sha256([t.text for t in timings]),
        "num_stopped_early": sum(t.num_tokens < s.output_len for t in timings),
        "date": time.strftime("%Y-%m-%d"),
    }
