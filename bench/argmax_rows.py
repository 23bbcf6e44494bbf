"""Time the greedy token of each row: torch.argmax against the project's CPU kernel (ssd/sampling/greedy.py), in one
process, the two taking turns on the same logits (float32, the LM head's output shapes of a decode step, a verify and
a draft step).

    python -m bench.argmax_rows [--threads 1] [--repeats 50] [--json out.json]

Each shape also checks that both give the same indices.
"""

import torch

from bench.call_timing import in_turns_ms, parse_args, write_rows
from ssd.layers import cpu_kernels
from ssd.sampling.greedy import argmax_rows

SHAPES = ((1, 49152), (5, 49152), (16, 49152), (80, 49152), (16, 8192))  # rows x vocabulary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n")[0], argv, repeats=50)
    if cpu_kernels.extension() is None:  # loaded as an engine loads it (the helper never builds the kernels itself)
        raise SystemExit("the project's CPU kernels are not available here")
    rows = []
    for shape in SHAPES:
        logits = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        if not torch.equal(argmax_rows(logits), logits.argmax(dim=-1)):
            raise SystemExit(f"argmax_rows differs from torch.argmax at {shape}")
        times = in_turns_ms({"torch": lambda x=logits: x.argmax(dim=-1), "own": lambda x=logits: argmax_rows(x)},
                            args.repeats)
        torch_ms, own_ms = times["torch"], times["own"]
        rows.append({"rows": shape[0], "vocab": shape[1], "torch_ms": torch_ms, "own_ms": own_ms})
        print(f"{shape[0]:4d} x {shape[1]:6d}  torch.argmax {torch_ms:7.3f} ms  own {own_ms:7.3f} ms  "
              f"{torch_ms / own_ms:5.1f}x")
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
