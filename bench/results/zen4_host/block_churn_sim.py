"""The block manager alone under churn (2026-12-06, docs/benchmarks.md "KV block scatter"): requests with shared
system prompts come and go, up to 6 at a time; prints the prefix-cache hit share and the mean run of consecutive
block ids of the finished sequences, then the table of a new 1,500-token sequence.
    PYTHONPATH=. python bench/results/zen4_host/block_churn_sim.py"""

import random
from dataclasses import dataclass, field

from ssd.kv.block_manager import BlockManager


@dataclass
class Seq:
    token_ids: list
    block_table: list = field(default_factory=list)
    num_cached_tokens: int = 0
    num_hashed_blocks: int = 0
    target: int = 0


def mean_run(table: list[int]) -> float:
    runs, cur = [], 1
    for a, b in zip(table, table[1:]):
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
    pairs = sum(b == a + 1 for a, b in zip(new.block_table, new.block_table[1:]))
    print(f"seed {seed}: prefix hit blocks {bm.num_prefix_hit_blocks} of {asked} ({bm.num_prefix_hit_blocks / asked:.3f}), "
          f"mean run of finished seqs {run_sum / run_n:.2f}; a new 1500-token sequence: {len(new.block_table)} blocks, "
          f"{pairs} consecutive pairs")


if __name__ == "__main__":
    for seed in range(3):
        simulate(seed)
