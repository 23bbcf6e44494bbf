"""What a long prompt arriving does to a stream that is already decoding: with and without chunked prefill.

    python -m bench.chunked_prefill                        # default model, bf16, 1 thread, chunks 0 (off), 256, 512

One engine per setting, in this process one after the other. Request A (a short chat prompt, 96 tokens, greedy)
decodes; once it has 16 tokens, request B arrives with a long prompt (`--long` tokens of the standard library's
source text). Reported per setting: A's largest gap between two tokens and its mean gap while B's prompt was
being fed, B's time to first token, and the total time until both finished.
"""

import argparse
import inspect
import json
import time

import torch

from ssd.llm import LLM
from ssd.sampling.params import SamplingParams


def long_prompt(llm: LLM, num_tokens: int) -> list[int]:
    import argparse as source_module

    ids = llm.tokenizer.encode(inspect.getsource(source_module))
    return (ids * (num_tokens // len(ids) + 1))[:num_tokens]


def run(model: str, chunk: int, num_long: int, threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    llm = LLM(model, dtype="bfloat16", num_threads=threads, prefill_chunk_tokens=chunk, enable_prefix_caching=False)
    engine = llm.engine
    short = llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": "Tell me a long story about a fox."}]))
    long = long_prompt(llm, num_long)
    llm.generate([short], SamplingParams(max_tokens=4))  # warm-up
    a = engine.add_request(short, SamplingParams(max_tokens=96, ignore_eos=True))
    a_times: list[float] = []
    b = b_added = b_first = None
    started = time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            now = time.perf_counter()
            if out.seq_id == a:
                a_times.extend([now] * len(out.new_token_ids))
            elif out.seq_id == b and b_first is None:
                b_first = now
        if b is None and len(a_times) >= 16:
            b, b_added = engine.add_request(long, SamplingParams(max_tokens=8, ignore_eos=True)), time.perf_counter()
    total = time.perf_counter() - started
    during = [t1 - t0 for t0, t1 in zip(a_times, a_times[1:], strict=False) if b_added <= t1 and t0 <= b_first]
    return {"prefill_chunk_tokens": chunk, "long_prompt_tokens": num_long,
            "a_max_gap_s": round(max(during), 3), "a_mean_gap_during_prefill_s": round(sum(during) / len(during), 3),
            "b_ttft_s": round(b_first - b_added, 3), "total_s": round(total, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--chunks", default="0,256,512", help="prefill_chunk_tokens values (0 = off)")
    p.add_argument("--long", type=int, default=2048, help="tokens of the long prompt")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    results = [run(args.model, int(c), args.long, args.threads) for c in args.chunks.split(",")]
    print("| prefill_chunk_tokens | A's largest gap (s) | A's mean gap while B prefills (s) | B's TTFT (s) | total (s) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['prefill_chunk_tokens'] or 'off'} | {r['a_max_gap_s']} | {r['a_mean_gap_during_prefill_s']} | "
              f"{r['b_ttft_s']} | {r['total_s']} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
