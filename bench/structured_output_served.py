"""Structured output through the served stack (`ssd serve`'s defaults: the shipped EAGLE-3 head, 8-node trees for
sd, SSD with its own draft process on core 1): the JSON prompts of bench.structured_output, free and under the
schema, in ar, sd and ssd, through the gateway with the `openai` client, one request at a time.

    python -m bench.structured_output_served --json bench/results/structured_output_served.json

Reports end-to-end tokens/s (the gateway's timing included, so lower than the engine's decode rate) and, from
`usage.speculation`, tokens per round and SSD's cache hit rate.
"""

import argparse
import json
import time
from pathlib import Path

from openai import OpenAI

from bench.structured_output import SCHEMA, SUBJECTS
from deploy.local import StackConfig, default_tree_budget, free_port, start_stack, stop_stack
from ssd.config import EngineConfig
from ssd.model_store import DEFAULT_DRAFT


def run(client: OpenAI, model: str, mode: str, schema: dict | None, max_tokens: int) -> dict:
    tokens, seconds, rounds, emitted, hits, misses, valid = 0, 0.0, 0, 0, 0, 0, 0
    for subject in SUBJECTS:
        extra: dict = {"mode": mode}
        fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}} if schema else None
        began = time.perf_counter()
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Describe {subject} as a JSON record."}],
            max_tokens=max_tokens, temperature=0, extra_body=extra, **({"response_format": fmt} if fmt else {}))
        seconds += time.perf_counter() - began
        tokens += reply.usage.completion_tokens
        spec = (reply.usage.model_extra or {}).get("speculation") or {}
        rounds += spec.get("num_drafts", 0)
        emitted += spec.get("num_accepted_tokens", 0) + spec.get("num_drafts", 0)  # each round: accepted + 1
        hits += spec.get("num_cache_hits", 0)
        misses += spec.get("num_cache_misses", 0)
        if schema:
            try:
                json.loads(reply.choices[0].message.content or "")
                valid += 1
            except json.JSONDecodeError:
                pass
    return {"tok_s_end_to_end": round(tokens / seconds, 2), "completion_tokens": tokens,
            "tokens_per_round": round(emitted / rounds, 3) if rounds else None,
            "cache_hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
            "valid_json": valid if schema else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    log_dir = Path("out/structured-output-served")
    log_dir.mkdir(parents=True, exist_ok=True)
    config = StackConfig(EngineConfig("smollm2-135m-instruct"), draft=DEFAULT_DRAFT,
                         tree_budget=default_tree_budget(DEFAULT_DRAFT), http_port=free_port(),
                         grpc_port=free_port(), log_dir=log_dir)
    stack = start_stack(config)
    results: dict = {"command": vars(args), "tree_budget": config.tree_budget}
    try:
        client = OpenAI(base_url=stack.url + "/v1", api_key="local")
        run(client, config.target.model, "ar", None, 8)  # warm-up
        for mode in ("ar", "sd", "ssd"):
            for label, schema in (("free", None), ("json_schema", SCHEMA)):
                results[f"{mode}/{label}"] = run(client, config.target.model, mode, schema, args.max_tokens)
                print(mode, label, results[f"{mode}/{label}"], flush=True)  # noqa: T201 (a benchmark's report)
    finally:
        stop_stack(stack)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
