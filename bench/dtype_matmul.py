"""Time one of the default model's matmuls in float32 and bfloat16 for a few row counts: what dtype "auto" decides.

    python -m bench.dtype_matmul --threads 2

Prints, per dtype and number of rows n (1 = a decode step, 5 = a K=4 verify, 64+ = prefill), the best of three
timings of `F.linear` against the MLP's [1536, 576] weight, and whether oneDNN reports a native bfloat16
path on this CPU (ssd.dtypes.cpu_has_fast_bfloat16). Used for docs/benchmarks.md's "dtype auto" entry.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F

from ssd.dtypes import auto_dtype_name, cpu_has_fast_bfloat16

ROWS = (1, 2, 5, 8, 64, 512)


def best_us(x: torch.Tensor, weight: torch.Tensor, repeats: int) -> float:
    for _ in range(3):
        F.linear(x, weight)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            F.linear(x, weight)
        best = min(best, (time.perf_counter() - started) / repeats)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-features", type=int, default=1536)
    parser.add_argument("--in-features", type=int, default=576)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "native_bfloat16": cpu_has_fast_bfloat16(), "auto": auto_dtype_name("cpu"), "us": {}}
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(args.out_features, args.in_features, dtype=dtype)  # [out, in]
        row = {}
        for n in ROWS:
            x = torch.randn(n, args.in_features, dtype=dtype)  # [n, in]
            row[n] = round(best_us(x, weight, repeats=max(5, 2000 // n)), 1)
        result["us"][str(dtype).removeprefix("torch.")] = row
    print(json.dumps(result))


if __name__ == "__main__":
    main()
