import random
from dataclasses import dataclass, field
from ssd.kv.block_manager import BlockManager
@dataclass
class Seq:
    token_ids: list
    block_table: list = field(default_factory=list)
    num_cached_tokens: int = 0
    num_hashed_blocks: int = 0
random.seed(0)
bm = BlockManager(728, 16, True)
live = []
def contiguity(t): return sum(b - a == 1 for a, b in zip(t, t[1:])) / max(1, len(t) - 1)
for step in range(20000):
    # admit
    if len(live) < 6 and random.random() < 0.05:
        n = random.randint(20, 600)
        s = Seq([random.randint(0, 50) for _ in range(n)] if random.random() < 0.5 else [1] * 64 + [random.randint(0, 50000) for _ in range(n)])
        if bm.can_allocate(s):
            bm.allocate(s); s.num_cached_tokens = len(s.token_ids); bm.commit(s); s.target = n + random.randint(50, 800); live.append(s)
    for s in list(live):
        s.token_ids.append(random.randint(0, 50000))
        if not bm.can_grow(s, len(s.token_ids)): bm.free(s); live.remove(s); continue
        bm.ensure_capacity(s, len(s.token_ids)); s.num_cached_tokens = len(s.token_ids) - 1; bm.commit(s)
        if len(s.token_ids) >= s.target: bm.free(s); live.remove(s)
# a new long sequence
s = Seq([random.randint(0, 50000) for _ in range(1500)]); bm.allocate(s)
print("new long seq: blocks", len(s.block_table), "contiguity", round(contiguity(s.block_table), 3), s.block_table[:24])
print("live:", [round(contiguity(x.block_table), 2) for x in live])

def runs(t):
    r, cur = [], 1
    for a, b in zip(t, t[1:]):
        if b == a + 1: cur += 1
        else: r.append(cur); cur = 1
    r.append(cur); return sum(r) / len(r)
print("mean run (blocks): new", round(runs(s.block_table), 2), "live", [round(runs(x.block_table), 2) for x in live])
