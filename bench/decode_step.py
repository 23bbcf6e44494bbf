"""Time the engine's plain decode step at a batch size and context length (no prefill in the timing).

    python -m bench.decode_step --batch 64 --context 400 --steps 32

Random prompt tokens (the attention cost depends on the context length, not on the text), greedy, EOS ignored.
Prints milliseconds per decode step and decode tokens per second; used for docs/benchmarks.md's paged-attention
entry. Compare two commits by running it in each checkout one after the other.
"""

import argparse
import json
import time

import torch

from ssd.llm import LLM
from ssd.model_store import resolve_model
from ssd.sampling.params import SamplingParams


def time_decode(model: str, batch: int, context: int, steps: int, dtype: str, threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    llm = LLM(str(resolve_model(model)), dtype=dtype, max_num_seqs=batch, enable_prefix_caching=False)
    engine = llm.engine
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(100, 40000, (context,), generator=generator).tolist(), params)
    started_seqs: set[int] = set()
    while len(started_seqs) < batch:  # prefill steps: every sequence gets its first token
        started_seqs.update(out.seq_id for out in engine.step())
    started, num_steps = time.perf_counter(), 0
    while engine.has_unfinished():
        engine.step()
        num_steps += 1
    seconds = time.perf_counter() - started
    return {"batch": batch, "context": context, "steps": num_steps, "ms_per_step": round(1000 * seconds / num_steps, 1),
            "decode_tok_s": round(batch * num_steps / seconds, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=400, help="prompt tokens per sequence")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    print(json.dumps(time_decode(args.model, args.batch, args.context, args.steps, args.dtype, args.threads)))


if __name__ == "__main__":
    main()
