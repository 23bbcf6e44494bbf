"""Service overhead: end-to-end tokens/s through gateway + target (ar, batch 1) vs the offline engine.

Run: .venv/bin/python -m tests.integration.service_overhead [--out bench/results/service_overhead.md]
Same prompts, greedy, bf16, one torch thread; the target service and this process (offline engine) are
pinned to the same core, the gateway to the other; service and offline runs alternate per prompt.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from openai import OpenAI

from deploy.local import free_port, start_stack, stop_stack
from tests.integration.helpers import stack_config

PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give me three ideas for a weekend trip near the mountains.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in a paragraph.",
    "List five healthy breakfast options and why they are good.",
]
MAX_TOKENS = 128


def run_service(client: OpenAI, model: str, prompt: str) -> tuple[int, float, float]:
    start, first = time.perf_counter(), None
    tokens = 0
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, extra_body={"mode": "ar"}):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return tokens, end - start, end - (first or end)


def run_offline(llm, prompt: str) -> tuple[int, float, float]:  # noqa: ANN001
    from ssd.sampling.params import SamplingParams

    text = llm.chat_prompt([{"role": "user", "content": prompt}])
    start, first, tokens = time.perf_counter(), None, 0
    for delta in llm.generate_stream(text, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)):
        first = first or time.perf_counter()
        tokens += len(delta.token_ids)
    end = time.perf_counter()
    return tokens, end - start, end - first


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("bench/results/service_overhead.md"))
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    config = stack_config(model="smollm2-135m-instruct", draft=None, dtype="bfloat16", default_mode="ar",
                         http_port=free_port(), grpc_port=free_port(), log_dir=Path("out/overhead-logs"))
    config.log_dir.mkdir(parents=True, exist_ok=True)
    stack = start_stack(config)  # target on cores[0] (the first model service), gateway unpinned
    try:
        os.sched_setaffinity(0, {cores[0]})
        gateway_pid = stack.child("gateway").proc.pid
        if len(cores) > 1:
            os.sched_setaffinity(gateway_pid, set(cores[1:]))
        import torch

        from ssd.llm import LLM

        torch.set_num_threads(1)
        llm = LLM(config.target.model, dtype="bfloat16", num_threads=1)
        client = OpenAI(base_url=stack.url + "/v1", api_key="local", max_retries=0)
        run_service(client, config.target.model, "warm up")
        run_offline(llm, "warm up")
        rows = {"service": [], "offline": []}
        client_cores = set(cores[1:]) or {cores[0]}
        for _ in range(args.repeats):
            for prompt in PROMPTS:
                os.sched_setaffinity(0, client_cores)  # the HTTP client sits with the gateway, not the target
                rows["service"].append(run_service(client, config.target.model, prompt))
                os.sched_setaffinity(0, {cores[0]})  # the offline engine gets the target's core
                rows["offline"].append(run_offline(llm, prompt))
    finally:
        stop_stack(stack)
    e2e = {k: sum(t for t, _, _ in v) / sum(s for _, s, _ in v) for k, v in rows.items()}
    decode = {k: statistics.mean((t - 1) / d for t, _, d in v if d > 0) for k, v in rows.items()}
    ttft = {k: statistics.mean(s - d for _, s, d in v) * 1000 for k, v in rows.items()}
    ratio = e2e["service"] / e2e["offline"]
    text = f"""# Service overhead: gateway + target vs the offline engine (ar, batch 1)

Command: `.venv/bin/python -m tests.integration.service_overhead` ({time.strftime('%Y-%m-%d')}, {len(cores)} cores,
SmolLM2-135M-Instruct bf16, one torch thread, greedy, max_tokens {MAX_TOKENS}, {len(PROMPTS)} chat prompts x
{args.repeats}, runs alternating; target and offline engine pinned to the same core, gateway and HTTP client on the other).

| path | end-to-end tokens/s | decode tokens/s | TTFT ms |
|---|---|---|---|
| offline engine (`LLM.generate_stream`) | {e2e['offline']:.1f} | {decode['offline']:.1f} | {ttft['offline']:.0f} |
| HTTP (openai client, SSE) -> gateway -> target (gRPC) | {e2e['service']:.1f} | {decode['service']:.1f} | {ttft['service']:.0f} |

Service / offline, end to end: **{ratio:.3f}** ({(ratio - 1) * 100:+.1f}%). Tokens generated: service
{sum(t for t, _, _ in rows['service'])}, offline {sum(t for t, _, _ in rows['offline'])} (same greedy output).
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
