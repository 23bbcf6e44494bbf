"""`make demo`: start the stack, send real prompts through the official openai client (streaming and not)
in ar, sd and (with a neural draft) ssd modes, print the answers and tokens/s per mode, ask for one answer as
JSON following a schema (structured output) and one as a tool call, and shut the stack down.

`make demo DRAFT=<draft checkpoint or EAGLE-3 head>` picks the draft (default: the shipped EAGLE-3 head, whose sd
requests speculate 8-node token trees; `DRAFT=ngram`: n-gram lookup, ar and sd chains only).
"""

import argparse
import sys
import time
from pathlib import Path

from openai import OpenAI

from deploy.local import StackConfig, StackStartError, default_tree_budget, free_port, start_stack, stop_stack
from ssd.config import EngineConfig
from ssd.fetch import is_offline
from ssd.model_store import DEFAULT_DRAFT

PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for writing clear code.",
]
MAX_TOKENS = 96
JSON_PROMPT = "What is the capital of France? Answer in JSON."
JSON_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "country", "is_capital"],
               "properties": {"city": {"type": "string", "maxLength": 24},
                              "country": {"type": "string", "maxLength": 24}, "is_capital": {"type": "boolean"}}}

TOOL_PROMPT = "What is the weather like in Paris?"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}]


def _print(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def modes_for(draft: str) -> tuple[str, ...]:
    """SSD needs a neural draft (its speculation cache is built by a model); n-gram lookup serves ar and sd."""
    return ("ar", "sd") if draft == "ngram" else ("ar", "sd", "ssd")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.demo", description=__doc__)
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="the shipped EAGLE-3 head (default), 'ngram', a draft checkpoint or an EAGLE-3 head folder")
    args = p.parse_args(argv)
    log_dir = Path("out/demo-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    config = StackConfig(EngineConfig("smollm2-135m-instruct"), draft=args.draft,
                         tree_budget=default_tree_budget(args.draft), http_port=free_port(), grpc_port=free_port(),
                         log_dir=log_dir, offline=is_offline())
    modes = modes_for(args.draft)
    _print(f"starting draft ({args.draft}), target and gateway (logs in {log_dir}/); modes {', '.join(modes)} ...\n")
    try:
        stack = start_stack(config)  # pulls the model first when it is not cached (unless SSD_OFFLINE=1)
    except StackStartError as e:
        sys.stderr.write(f"demo: cannot start: {e}\n")
        return 1
    try:
        client = OpenAI(base_url=stack.url + "/v1", api_key="local")
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        for i, prompt in enumerate(PROMPTS):
            for mode in modes:
                stream = i % 2 == 0
                _print(f"\n--- [{mode}, {'streaming' if stream else 'not streaming'}] {prompt}\n")
                start = time.perf_counter()
                messages = [{"role": "user", "content": prompt}]
                extra = {"mode": mode}
                if stream:
                    chunks = client.chat.completions.create(
                        model=config.target.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                        stream_options={"include_usage": True}, extra_body=extra)
                    tokens = 0
                    for chunk in chunks:
                        if chunk.choices and chunk.choices[0].delta.content:
                            _print(chunk.choices[0].delta.content)
                        if chunk.usage is not None:
                            tokens = chunk.usage.completion_tokens
                else:
                    reply = client.chat.completions.create(model=config.target.model, messages=messages,
                                                           max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
                    _print(reply.choices[0].message.content or "")
                    tokens = reply.usage.completion_tokens
                elapsed = time.perf_counter() - start
                rates[mode].append(tokens / elapsed)
                _print(f"\n[{tokens} tokens in {elapsed:.2f} s: {tokens / elapsed:.1f} tokens/s end to end]\n")
        _print("\n=== tokens/s end to end (gateway + target, batch 1, dtype auto: bf16 where native, else float32) ===\n")
        for mode, values in rates.items():
            _print(f"  {mode}: {sum(values) / len(values):.1f} tokens/s (mean of {len(values)})\n")
        _print(f"\n=== structured output: response_format json_schema (server default mode) ===\n{JSON_PROMPT}\n")
        reply = client.chat.completions.create(
            model=config.target.model, messages=[{"role": "user", "content": JSON_PROMPT}], max_tokens=64, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": JSON_SCHEMA}})
        _print(f"{reply.choices[0].message.content}\n")
        _print(f"\n=== function calling: tools + tool_choice \"required\" ===\n{TOOL_PROMPT}\n")
        reply = client.chat.completions.create(
            model=config.target.model, messages=[{"role": "user", "content": TOOL_PROMPT}], max_tokens=64, temperature=0,
            tools=TOOLS, tool_choice="required")
        for call in reply.choices[0].message.tool_calls or []:
            _print(f"{call.function.name}({call.function.arguments})\n")
    finally:
        stop_stack(stack)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
