"""Time the engine's decode step: ms per step and per token, eager against compiled, against the bandwidth floor.

    python -m bench.decode_step --batch 64 --context 400 --steps 32          # random prompts of one length
    python -m bench.decode_step --dataset mtbench --numseqs 16 --output-len 128 --batch 1 --compile off,on

Greedy, EOS ignored, no prefill in the timing. With several `--compile` modes one engine is built per mode in this
process and the modes take turns round by round (A/B interleaved: a shared machine's load hits both alike).
The floor is the weight bytes read per step over the memory read bandwidth, measured by copying a large tensor.
Compare two commits by running it in each checkout one after the other.
"""

import argparse
import json
import time

import torch

from ssd.llm import LLM
from ssd.model_store import resolve_model
from ssd.sampling.params import SamplingParams


def read_bandwidth_gb_s(megabytes: int = 512, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes read per second by a large tensor copy on `device` (best of `repeats`; a copy reads and writes each
    byte, so the memory moves twice this)."""
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return src.numel() * 4 / best / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def weight_bytes(llm: LLM) -> int:
    return sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())


def decode_ms_per_step(llm: LLM, prompts: list[list[int]], batch: int, steps: int) -> float:
    """Decode `prompts` in groups of `batch`, `steps` tokens each after the first; mean ms per decode step."""
    engine, seconds, num_steps = llm.engine, 0.0, 0
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        for p in group:
            engine.add_request(p, params)
        started_seqs: set[int] = set()
        while len(started_seqs) < len(group):  # prefill steps: every sequence gets its first token
            started_seqs.update(out.seq_id for out in engine.step())
        started = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
            num_steps += 1
        seconds += time.perf_counter() - started
    return 1000 * seconds / num_steps


def load_token_prompts(args: argparse.Namespace, llm: LLM) -> list[list[int]]:
    if args.dataset is None:
        generator = torch.Generator().manual_seed(0)
        return [torch.randint(100, 40000, (args.context,), generator=generator).tolist() for _ in range(args.batch)]
    from bench.datasets import load_prompts

    texts = [llm.chat_prompt([{"role": "user", "content": p.text}]) if p.is_chat else p.text
             for p in load_prompts(args.dataset, args.numseqs)]
    return [llm.tokenizer.encode(t) for t in texts]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=400, help="random prompts: tokens per prompt")
    p.add_argument("--steps", type=int, default=32, help="random prompts: decode steps")
    p.add_argument("--dataset", default=None, help="real prompts instead (bench/datasets.py), e.g. mtbench")
    p.add_argument("--numseqs", type=int, default=16, help="--dataset: prompts")
    p.add_argument("--output-len", type=int, default=128, help="--dataset: tokens per prompt")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", default="default",
                   help="comma list of modes to interleave, e.g. off,on; default: the engine's own (any checkout)")
    p.add_argument("--rounds", type=int, default=1, help="passes over the prompts per mode (interleaved)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    modes = args.compile.split(",")
    llms = {m: LLM(str(resolve_model(args.model)), dtype=args.dtype, max_num_seqs=args.batch,
                   enable_prefix_caching=False, **({} if m == "default" else {"compile": m})) for m in modes}
    first = llms[modes[0]]
    prompts = load_token_prompts(args, first)
    steps = args.steps if args.dataset is None else args.output_len - 1
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            times[m].append(decode_ms_per_step(llms[m], prompts, args.batch, steps))
    bandwidth = read_bandwidth_gb_s()
    floor_ms = weight_bytes(first) / bandwidth / 1e6
    for m in modes:
        ms = min(times[m])
        print(json.dumps({"compile": m, "batch": args.batch, "dataset": args.dataset or f"random-{args.context}",
                          "threads": args.threads, "dtype": args.dtype, "ms_per_step": round(ms, 1),
                          "ms_per_token": round(ms / args.batch, 2), "decode_tok_s": round(1000 * args.batch / ms, 1),
                          "rounds_ms": [round(t, 1) for t in times[m]], "read_gb_s": round(bandwidth, 1),
                          "floor_ms_per_step": round(floor_ms, 2), "x_floor": round(ms / floor_ms, 1)}))


if __name__ == "__main__":
    main()
