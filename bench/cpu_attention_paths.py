"""Time the CPU few-query attention op on its two paths for bfloat16: the vector loops (path 0) against AMX tiles
(ssd_kernels/cpu/attention_amx.cpp), in one process, taking turns on the same inputs (one layer, keys in consecutive
slots as a paged cache's blocks hold them, every sequence the same length).

    python -m bench.cpu_attention_paths [--threads 1] [--repeats 30] [--json out.json]

Shapes: the default model's heads (9 query heads, 3 KV heads, D = 64) at the decode step (Q = 1) and the K = 4
verify (Q = 5) of batches 1, 4 and 16, and Llama-3.1-8B's (32 / 8, D = 128). Each case also checks that the two
paths agree within bfloat16's rounding. Needs a CPU with AMX-BF16.
"""

import torch

from bench.call_timing import in_turns_ms, parse_args, write_rows
from ssd.layers import cpu_kernels
from ssd_kernels.cpu import extension as own_ext

# (batch, queries per sequence, keys per sequence, query heads, KV heads, head size)
CASES = ((1, 1, 200, 9, 3, 64), (1, 5, 200, 9, 3, 64), (4, 5, 200, 9, 3, 64), (16, 1, 200, 9, 3, 64),
         (16, 5, 200, 9, 3, 64), (1, 5, 1000, 9, 3, 64), (16, 5, 1000, 9, 3, 64), (1, 1, 2000, 9, 3, 64),
         (1, 1, 1000, 32, 8, 128), (1, 5, 1000, 32, 8, 128), (8, 1, 1000, 32, 8, 128))


def _inputs(batch: int, queries: int, keys: int, heads: int, kv_heads: int, d: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, kv_heads, batch * keys + 64, d, generator=g).bfloat16()  # [2, KVH, slots, D]
    kv_slots = torch.arange(batch * keys).view(batch, keys)  # [B, S]
    seq_lens = torch.full((batch,), keys, dtype=torch.int64)
    q = torch.randn(batch * queries, heads, d, generator=g).bfloat16()  # [B * Q, H, D]
    return q, cache, kv_slots, seq_lens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n")[0], argv, repeats=30)
    ext = cpu_kernels.extension()
    if ext is None or own_ext.AMX_BF16 not in own_ext.supported_paths(ext):
        raise SystemExit("this bench needs the project's CPU kernels on a CPU with AMX-BF16")
    rows = []
    for batch, queries, keys, heads, kv_heads, d in CASES:
        q, cache, kv_slots, seq_lens = _inputs(batch, queries, keys, heads, kv_heads, d)

        def attend(path: int, q=q, cache=cache, kv_slots=kv_slots, seq_lens=seq_lens, queries=queries, d=d):
            return ext.paged_attention(q, cache, kv_slots, seq_lens, queries, d**-0.5, path)

        loops, tiles = attend(0).float(), attend(own_ext.AMX_BF16).float()
        if ((loops - tiles).abs().max() / loops.abs().max()).item() > 2e-2:
            raise SystemExit(f"the two paths disagree at batch {batch}, Q {queries}, {keys} keys, D {d}")
        times = in_turns_ms({"loops": lambda: attend(0), "amx": lambda: attend(own_ext.AMX_BF16)}, args.repeats)
        loops_ms, tiles_ms = times["loops"], times["amx"]
        rows.append({"batch": batch, "queries": queries, "keys": keys, "heads": heads, "kv_heads": kv_heads,
                     "head_dim": d, "loops_ms": loops_ms, "amx_ms": tiles_ms})
        print(f"batch {batch:2d}  Q {queries}  {keys:4d} keys  heads {heads}/{kv_heads}  D {d:3d}  "
              f"loops {loops_ms:7.4f} ms  AMX {tiles_ms:7.4f} ms  {loops_ms / tiles_ms:4.2f}x")
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
