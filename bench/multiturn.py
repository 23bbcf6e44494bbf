"""Multi-turn chat with an EAGLE-3 draft, prefix caching on vs off: TTFT per turn, prompt tokens served from the
prefix cache, and whether the answers are the same text.

    python -m bench.multiturn --conversations 8 --turns 4 --max-tokens 64 --threads 2

Each chat's turns run in order (turn t's prompt holds every earlier question and the model's own answer), greedy,
one chat at a time, in one process: first with prefix caching, then without, on the same engine settings.
`--through-stack`: the same chats through real services (gateway, target, EAGLE-3 draft service) driven with the
`openai` client, streamed (bench/multiturn_stack.py).
"""

import argparse
import json
import statistics
import time

from bench.datasets import load_conversations
from ssd.config import ProposerChoice, SpeculationConfig
from ssd.llm import LLM
from ssd.log_setup import configure_logging
from ssd.model_store import DEFAULT_DRAFT, DEFAULT_MODEL
from ssd.sampling.params import SamplingParams


def run_chats(llm: LLM, chats: list[list[str]], max_tokens: int) -> list[list[dict]]:
    """-> per chat, per turn: {ttft_s, prompt_tokens, cached_tokens, text}."""
    params = SamplingParams(max_tokens=max_tokens)
    results = []
    for questions in chats:
        messages, turns = [], []
        for question in questions:
            messages.append({"role": "user", "content": question})
            out = llm.chat(messages, params)[0]
            messages.append({"role": "assistant", "content": out.text})
            turns.append({"ttft_s": out.ttft_s, "prompt_tokens": len(out.prompt_token_ids),
                          "completion_tokens": len(out.token_ids),
                          "cached_tokens": out.num_cached_prompt_tokens, "text": out.text})
        results.append(turns)
    return results


def summarize(results: list[list[dict]]) -> dict:
    later = [t for chat in results for t in chat[1:]]
    # the tokens the previous turn's request held (prompt + answer): an upper bound of what a prefix cache can serve
    held = [min(prev["prompt_tokens"] + prev.get("completion_tokens", 0), t["prompt_tokens"])
            for chat in results for prev, t in zip(chat[:-1], chat[1:], strict=True)]
    return {
        "ttft_ms_turn1_median": 1000 * statistics.median(chat[0]["ttft_s"] for chat in results),
        "ttft_ms_later_median": 1000 * statistics.median(t["ttft_s"] for t in later),
        "later_prompt_tokens": sum(t["prompt_tokens"] for t in later),
        "later_cached_tokens": sum(t["cached_tokens"] for t in later),
        "later_hit_rate": sum(t["cached_tokens"] for t in later) / max(1, sum(t["prompt_tokens"] for t in later)),
        "later_previous_request_tokens": sum(held),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the JSON here too")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (the prefix cache's unit)")
    p.add_argument("--through-stack", action="store_true",
                   help="through real services (ssd serve's launcher) and the openai client, not in one process")
    args = p.parse_args()
    configure_logging("warning")
    chats = load_conversations(args.conversations, args.turns)
    report = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    texts = {}
    for name, caching in (("prefix_caching", True), ("no_prefix_caching", False)):
        if args.through_stack:
            from bench.multiturn_stack import run_stack_chats

            results, report[name + "_draft"] = run_stack_chats(args.model, args.draft, args.dtype, args.k, chats,
                                                               args.max_tokens, caching, block_size=args.block_size)
        else:
            speculation = SpeculationConfig(ProposerChoice(args.draft), num_speculative_tokens=args.k)
            with LLM(args.model, dtype=args.dtype, num_threads=args.threads, speculation=speculation,
                     enable_prefix_caching=caching, block_size=args.block_size) as llm:
                results = run_chats(llm, chats, args.max_tokens)
        report[name] = summarize(results)
        texts[name] = [[t["text"] for t in chat] for chat in results]
    report["same_text"] = texts["prefix_caching"] == texts["no_prefix_caching"]
    pairs = list(zip(texts["prefix_caching"], texts["no_prefix_caching"], strict=True))
    report["chats_identical"] = sum(a == b for a, b in pairs)  # bf16 rounds prefills of other lengths differently
    report["first_turns_identical"] = sum(a[0] == b[0] for a, b in pairs)
    report["ttft_later_ratio"] = (report["no_prefix_caching"]["ttft_ms_later_median"]
                                  / report["prefix_caching"]["ttft_ms_later_median"])
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
