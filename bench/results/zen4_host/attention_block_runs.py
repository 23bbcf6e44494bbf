import time, torch
from ssd.layers.cpu_kernels import extension
ext = extension(); torch.set_num_threads(1); torch.manual_seed(0)
L, KVH, H, D, bs = 30, 3, 9, 64, 16
caches = [torch.randn(2, KVH, 728 * 16, D).bfloat16() for _ in range(L)]
S = 1000; nb = (S + bs - 1) // bs
out = []
for run in (1, 2, 4, 8, 64):
    starts = torch.randperm(728 // run)[: (nb + run - 1) // run] * run
    blocks = (starts[:, None] + torch.arange(run)[None]).reshape(-1)[:nb]
    kv_slots = (blocks[torch.arange(S) // bs] * bs + torch.arange(S) % bs)[None].contiguous()
    q = torch.randn(1, H, D).bfloat16(); seq_lens = torch.tensor([S])
    best = 1e9
    for rep in range(15):
        t = time.perf_counter(); [ext.paged_attention(q, c, kv_slots, seq_lens, 1, 0.125) for c in caches]
        best = min(best, time.perf_counter() - t)
    out.append(f"run {run}: {best*1e3:.2f}")
print(" | ".join(out))
