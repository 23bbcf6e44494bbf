"""The KV block manager alone under churn: how scattered a served engine's block tables become.

    python -m bench.block_churn

Requests with one of 30 shared system prompts come and go, up to 6 at a time, for 30,000 decode steps on 728
blocks. Prints, per seed, the prefix cache's hit share, the mean run of consecutive block ids of the finished
sequences, and how many consecutive pairs a new 1,500-token sequence's table then has (bench/kv_block_scatter.py
times attention over such tables).
"""

import random
from dataclasses import dataclass, field
from itertools import pairwise

from ssd.kv.block_manager import BlockManager


@dataclass
class Seq:
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_hashed_blocks: int = 0
    target: int = 0


def mean_run(table: list[int]) -> float:
    runs, cur = [], 1
    for a, b in pairwise(table):
        if b == a + 1:
            cur += 1
        else:
            runs.append(cur)
            cur = 1
    runs.append(cur)
    return sum(runs) / len(runs)


def simulate(seed: int, steps: int = 30000) -> None:
    random.seed(seed)
    bm = BlockManager(728, 16, True)
    systems = [[random.randint(0, 50000) for _ in range(random.randint(100, 400))] for _ in range(30)]
    live, asked, run_sum, run_n = [], 0, 0.0, 0
    for _ in range(steps):
        if len(live) < 6 and random.random() < 0.05:
            s = Seq(random.choice(systems) + [random.randint(0, 50000) for _ in range(random.randint(10, 200))])
            if bm.can_allocate(s):
                asked += (len(s.token_ids) - 1) // 16
                bm.allocate(s)
                s.num_cached_tokens = len(s.token_ids)
                bm.commit(s)
                s.target = len(s.token_ids) + random.randint(50, 600)
                live.append(s)
        for s in list(live):
            s.token_ids.append(random.randint(0, 50000))
            if not bm.can_grow(s, len(s.token_ids)):
                bm.free(s)
                live.remove(s)
                continue
            bm.ensure_capacity(s, len(s.token_ids))
            s.num_cached_tokens = len(s.token_ids) - 1
            bm.commit(s)
            if len(s.token_ids) >= s.target:
                run_sum += mean_run(s.block_table)
                run_n += 1
                bm.free(s)
                live.remove(s)
    for s in live:
        bm.free(s)
    new = Seq([random.randint(0, 50000) for _ in range(1500)])
    bm.allocate(new)
    pairs = sum(b == a + 1 for a, b in pairwise(new.block_table))
    hits = bm.num_prefix_hit_blocks
    print(f"seed {seed}: prefix hit blocks {hits} of {asked} ({hits / asked:.3f}), mean run of finished sequences "
          f"{run_sum / run_n:.2f}; a new 1500-token sequence: {len(new.block_table)} blocks, {pairs} consecutive pairs")


def main() -> None:
    for seed in range(3):
        simulate(seed)


if __name__ == "__main__":
    main()
