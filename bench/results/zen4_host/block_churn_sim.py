import random, sys
from dataclasses import dataclass, field
from ssd.kv.block_manager import BlockManager
@dataclass
class Seq:
    token_ids: list
    block_table: list = field(default_factory=list)
    num_cached_tokens: int = 0
    num_hashed_blocks: int = 0
def runs(t):
    r, cur = [], 1
    for a, b in zip(t, t[1:]):
        if b == a + 1: cur += 1
        else: r.append(cur); cur = 1
    r.append(cur); return sum(r) / len(r)
for seed in range(3):
    random.seed(seed)
    bm = BlockManager(728, 16, True)
    systems = [[random.randint(0, 50000) for _ in range(random.randint(100, 400))] for _ in range(30)]
    live, asked, run_sum, run_n = [], 0, 0.0, 0
    for step in range(30000):
        if len(live) < 6 and random.random() < 0.05:
            s = Seq(random.choice(systems) + [random.randint(0, 50000) for _ in range(random.randint(10, 200))])
            if bm.can_allocate(s):
                asked += (len(s.token_ids) - 1) // 16
                bm.allocate(s); s.num_cached_tokens = len(s.token_ids); bm.commit(s); s.target = len(s.token_ids) + random.randint(50, 600); live.append(s)
        for s in list(live):
            s.token_ids.append(random.randint(0, 50000))
            if not bm.can_grow(s, len(s.token_ids)): bm.free(s); live.remove(s); continue
            bm.ensure_capacity(s, len(s.token_ids)); s.num_cached_tokens = len(s.token_ids) - 1; bm.commit(s)
            if len(s.token_ids) >= s.target:
                run_sum += runs(s.block_table); run_n += 1
                bm.free(s); live.remove(s)
    print(f"seed {seed}: prefix hit blocks {bm.num_prefix_hit_blocks} of {asked} ({bm.num_prefix_hit_blocks/asked:.3f}), mean run of finished seqs {run_sum/run_n:.2f}")
