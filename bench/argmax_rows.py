"""Time the greedy token of each row: torch.argmax against the project's CPU kernel (ssd/sampling/greedy.py), in one
process, the two taking turns on the same logits (float32, the LM head's output shapes of a decode step, a verify and
a draft step).

    python -m bench.argmax_rows [--threads 1] [--repeats 50] [--json out.json]

Each shape also checks that both give the same indices.
"""

import argparse
import json
import time

import torch

from ssd.layers import cpu_kernels
from ssd.sampling.greedy import argmax_rows

SHAPES = ((1, 49152), (5, 49152), (16, 49152), (80, 49152), (16, 8192))  # rows x vocabulary


def _median_ms(fn, logits: torch.Tensor, repeats: int) -> float:  # noqa: ANN001 - either argmax
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn(logits)
        times.append(time.perf_counter() - started)
    return 1000 * sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if cpu_kernels.extension() is None:  # loaded as an engine loads it (the helper never builds the kernels itself)
        raise SystemExit("the project's CPU kernels are not available here")
    rows = []
    for shape in SHAPES:
        logits = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        if not torch.equal(argmax_rows(logits), logits.argmax(dim=-1)):
            raise SystemExit(f"argmax_rows differs from torch.argmax at {shape}")
        torch_ms = own_ms = float("inf")
        for _ in range(3):  # in turn: a noisy spell hits both
            torch_ms = min(torch_ms, _median_ms(lambda x: x.argmax(dim=-1), logits, args.repeats))
            own_ms = min(own_ms, _median_ms(argmax_rows, logits, args.repeats))
        rows.append({"rows": shape[0], "vocab": shape[1], "torch_ms": torch_ms, "own_ms": own_ms})
        print(f"{shape[0]:4d} x {shape[1]:6d}  torch.argmax {torch_ms:7.3f} ms  own {own_ms:7.3f} ms  "
              f"{torch_ms / own_ms:5.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
