"""`python -m bench.multiturn --through-stack`: the multi-turn chats through real services, prefix caching on vs off.

Starts the stack the way `ssd serve` does (deploy/local.py: gateway, target, draft service with the EAGLE-3 head)
once with prefix caching and once with the targets' `--no-prefix-caching`, and drives each with the `openai`
client: streamed chat completions, greedy, one chat at a time, each chat's turns in order (turn t's messages hold
every earlier question and the answer the stack streamed). Per turn: TTFT (request sent to first content chunk),
prompt tokens and `usage.prompt_tokens_details.cached_tokens`; per run: the draft's own prefix-cache counters
(`ssd:draft_prefix_cache_*` from its /metrics).
"""

import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from deploy.local import StackConfig, free_port, start_stack, stop_stack
from ssd.config import EngineConfig

DRAFT_PREFIX_SERIES = ("ssd:draft_prefix_cache_queries", "ssd:draft_prefix_cache_hits")


def _turn(client, model: str, messages: list[dict], max_tokens: int) -> dict:  # noqa: ANN001
    """One streamed greedy chat turn: {ttft_s, prompt_tokens, completion_tokens, cached_tokens, text}."""
    start = time.perf_counter()
    first, pieces, usage = None, [], None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0.0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    details = usage.prompt_tokens_details if usage is not None else None
    return {"ttft_s": (first or time.perf_counter()) - start, "prompt_tokens": usage.prompt_tokens if usage else 0,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "cached_tokens": (details.cached_tokens or 0) if details is not None else 0, "text": "".join(pieces)}


def _draft_prefix_counters(url: str | None) -> dict[str, float]:
    if url is None:
        return {}
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the local draft's /metrics
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.removesuffix("_total") in DRAFT_PREFIX_SERIES:
                out[sample.name.removesuffix("_total")] = sample.value
    return out


def run_stack_chats(model: str, draft: str, dtype: str, k: int, chats: list[list[str]], max_tokens: int,
                    prefix_caching: bool, log_dir: Path | None = None, block_size: int = 16) -> tuple[list[list[dict]], dict]:
    """-> (per chat, per turn: {ttft_s, prompt_tokens, cached_tokens, text}; the draft's prefix counters)."""
    from openai import OpenAI

    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="ssd-multiturn-"))
    target = EngineConfig(model, dtype=dtype, enable_prefix_caching=prefix_caching, block_size=block_size)
    config = StackConfig(target, draft=draft, k=k, http_port=free_port(), grpc_port=free_port(), log_dir=log_dir)
    stack = start_stack(config, timeout_s=600)
    try:
        client = OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        name = client.models.list().data[0].id
        results = []
        for questions in chats:
            messages, turns = [], []
            for question in questions:
                messages.append({"role": "user", "content": question})
                turns.append(_turn(client, name, messages, max_tokens))
                messages.append({"role": "assistant", "content": turns[-1]["text"]})
            results.append(turns)
        draft_child = next((c for c in stack.children if c.name.startswith("draft")), None)
        counters = _draft_prefix_counters(draft_child.metrics_url if draft_child is not None else None)
    finally:
        stop_stack(stack)
    return results, counters
