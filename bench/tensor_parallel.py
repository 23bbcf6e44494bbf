"""Tensor parallelism on this machine's cores: decode tokens/s of one model whole and sharded, in one process.

    python -m bench.tensor_parallel                      # a stand-in for the default model, sizes 1 and 2
    python -m bench.tensor_parallel --model smollm2-135m-instruct --sizes 1,3

The default model's 9 attention heads and 3 KV heads split only 3 ways. The stand-in has its shape (30 layers,
hidden 576, MLP 1536, vocabulary 49152) with 8 heads of 72 and 2 KV heads, so 2 ranks can shard it; its
weights are random (the speed of a forward does not depend on them), written once to a temp folder.
Real MT-Bench prompt tokens are not needed: random prompt ids of a fixed length, greedy, EOS ignored.

Each configuration is timed in turn in this process (rank 0) after a warm-up: whole with 1 thread, whole
with `--threads` threads, and each size > 1 with 1 thread per rank over shared-memory collectives and over
gloo. The ranks pin themselves to one core each. Prints a markdown table with ratios to the 1-thread run.
"""

import argparse
import tempfile
from pathlib import Path

import torch

from ssd.llm import LLM
from ssd.model_store import resolve_model
from ssd.sampling.params import SamplingParams


def write_standin(folder: Path) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=72, max_position_embeddings=2048,
                         tie_word_embeddings=True, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    return folder


def decode_rate(model: str, batch: int, context: int, tokens: int, **options: object) -> float:
    """Decode tokens/s of `batch` random prompts of `context` tokens, `tokens` each (prefill not timed)."""
    llm = LLM(model, dtype="bfloat16", max_num_seqs=batch, **options)
    try:
        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(100, 40000, (context,), generator=generator).tolist() for _ in range(batch)]
        llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
        outs = llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
        decode_s = max((o.latency_s or 0.0) - (o.ttft_s or 0.0) for o in outs)
        return batch * (tokens - 1) / decode_s
    finally:
        llm.engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the stand-in for the default model")
    p.add_argument("--sizes", default="1,2", help="tensor-parallel sizes (comma list; 1 = whole)")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--context", type=int, default=256, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--threads", type=int, default=2, help="threads of the whole model's second run")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(resolve_model(args.model)) if args.model else str(write_standin(Path(tmp)))
        configs: list[tuple[str, dict]] = [("whole, 1 thread", {"num_threads": 1}),
                                           (f"whole, {args.threads} threads", {"num_threads": args.threads})]
        for size in (int(s) for s in args.sizes.split(",") if int(s) > 1):
            for collectives in ("auto", "gloo"):
                name = "shared memory" if collectives == "auto" else "gloo"
                configs.append((f"{size} ranks x 1 thread, {name}", {
                    "num_threads": 1, "tensor_parallel_size": size, "tensor_parallel_collectives": collectives}))
        print(f"model: {args.model or 'stand-in (default model shape, 8 heads / 2 KV heads)'}, "
              f"context {args.context}, {args.tokens} tokens, bf16, greedy")
        print("| configuration | " + " | ".join(f"batch {b} tok/s (x 1 thread)" for b in args.batches.split(",")) + " |")
        print("|---|" + "---|" * len(args.batches.split(",")))
        base: dict[int, float] = {}
        for name, options in configs:
            cells = []
            for batch in (int(b) for b in args.batches.split(",")):
                torch.set_num_threads(int(options["num_threads"]))
                rate = decode_rate(model, batch, args.context, args.tokens, **options)
                base.setdefault(batch, rate)
                cells.append(f"{rate:.1f} ({rate / base[batch]:.2f}x)")
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
