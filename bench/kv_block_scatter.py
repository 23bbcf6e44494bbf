"""Paged attention over KV blocks scattered through the cache vs in runs of consecutive blocks, in one process.

    python -m bench.kv_block_scatter --keys 1000,3000 --runs 1,2,4,8,64 --threads 1

The CPU attention op alone on the default model's shapes (30 layers x 3 KV heads, head size 64, bfloat16, 728
blocks of 16 slots per layer, random keys), one decode query per sequence: each case is a block table made of
runs of `run` consecutive blocks in a random order (run 64: contiguous). Prints the best of 15 passes over the
30 layers, in ms. A served engine's tables end up scattered (bench/block_churn.py).
"""

import argparse
import time

import torch

from ssd.layers.cpu_kernels import extension

LAYERS, KV_HEADS, HEADS, HEAD_DIM, BLOCK, NUM_BLOCKS = 30, 3, 9, 64, 16, 728


def block_table(num_keys: int, run: int, gen: torch.Generator) -> torch.Tensor:
    """[ceil(num_keys / BLOCK)] block ids: runs of `run` consecutive blocks, the runs in a random order."""
    blocks = -(-num_keys // BLOCK)
    starts = torch.randperm(NUM_BLOCKS // run, generator=gen)[: -(-blocks // run)] * run
    return (starts[:, None] + torch.arange(run)[None]).reshape(-1)[:blocks]


def time_case(ops: object, caches: list[torch.Tensor], num_keys: int, run: int, gen: torch.Generator) -> float:
    """Best ms of 15 passes of one decode query's attention over all layers."""
    table = block_table(num_keys, run, gen)
    key = torch.arange(num_keys)
    kv_slots = (table[key // BLOCK] * BLOCK + key % BLOCK)[None].contiguous()  # [1, S]
    q = torch.randn(1, HEADS, HEAD_DIM, generator=gen).bfloat16()
    seq_lens = torch.tensor([num_keys])
    best = float("inf")
    for _ in range(15):
        started = time.perf_counter()
        for cache in caches:
            ops.paged_attention(q, cache, kv_slots, seq_lens, 1, HEAD_DIM**-0.5)
        best = min(best, time.perf_counter() - started)
    return 1e3 * best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default="1000,3000")
    p.add_argument("--runs", default="1,2,4,8,64")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ops = extension()
    if ops is None:
        raise SystemExit("the project's CPU kernels do not build on this machine")
    gen = torch.Generator().manual_seed(0)
    caches = [torch.randn(2, KV_HEADS, NUM_BLOCKS * BLOCK, HEAD_DIM, generator=gen).bfloat16() for _ in range(LAYERS)]
    for num_keys in (int(k) for k in a.keys.split(",")):
        cells = [f"run {run}: {time_case(ops, caches, num_keys, int(run), gen):.2f} ms" for run in a.runs.split(",")]
        print(f"{num_keys} keys | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
