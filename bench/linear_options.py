"""The default model's linears on this CPU, one matmul option against another: which one the engine should use.

    taskset -c 1 python -m bench.linear_options --rows 1,2,5,8,16 --rounds 5 --json /tmp/linear_options.json
    taskset -c 1 python -m bench.linear_options --rows 1,8 --compile   # adds inductor max-autotune (slow to build)

Holds 30 layers' worth of distinct weights for each of SmolLM2-135M's linear shapes (qkv, o, gate_up, down) and
its tied LM head, so every matmul reads its weight from memory as a decode step does, not from a warm cache.
Per option and row count, one pass runs all 30 layers of a shape back to back; options are interleaved round by
round in this one process and the best round counts, so ratios hold on a shared machine. Each time is also given
as GB/s (bytes of the weight in its dtype / time), against a plain copy of a 512 MiB buffer measured here
(bytes copied / time). The sum over shapes is the whole model's linear time per decode step.
"""

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
Matmul = Callable[[torch.Tensor], torch.Tensor]  # x [M, K] -> [M, N]


def copy_gbs(rounds: int) -> float:
    """Plain copy bandwidth, GB/s of bytes copied, over a 512 MiB buffer (the best of `rounds`)."""
    src = torch.empty(1 << 28, dtype=torch.bfloat16).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds + 1):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return src.numel() * src.element_size() / best / 1e9


def _padded(fn: Matmul, rows: int) -> Matmul:
    """`fn` on x padded with zero rows to a multiple of `rows` (the AMX tile height), sliced back."""
    def run(x: torch.Tensor) -> torch.Tensor:
        pad = -x.shape[0] % rows
        return fn(F.pad(x, (0, 0, 0, pad)))[: x.shape[0]] if pad else fn(x)
    return run


def float_options(w: torch.Tensor) -> dict[str, Matmul]:
    """The float ways to run x @ w.T for one weight w [N, K] (float32 master copy). oneDNN packs bf16 weights only
    on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere (AVX2-only, e.g. Zen 3) those options are left out."""
    bf16, fp32 = w.bfloat16(), w.float()
    packed_fp32 = torch.ops.mkldnn._reorder_linear_weight(fp32, 1)
    t_bf16 = bf16.t().contiguous()  # [K, N]

    def onednn(packed: torch.Tensor) -> Matmul:
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    options: dict[str, Matmul] = {
        "fp32 F.linear": lambda x: F.linear(x.float(), fp32),
        "fp32 oneDNN packed": lambda x: onednn(packed_fp32)(x.float()),
        "bf16 F.linear": lambda x: F.linear(x, bf16),
        "bf16 mm on [K,N] weight": lambda x: torch.mm(x, t_bf16),
    }
    try:
        packed_bf16 = torch.ops.mkldnn._reorder_linear_weight(bf16, 1)
        packed_bf16_16 = torch.ops.mkldnn._reorder_linear_weight(bf16, 16)  # packed for a batch of 16 rows
    except RuntimeError:  # this CPU's oneDNN has no bf16 packing
        return options
    return options | {
        "bf16 oneDNN packed (today)": onednn(packed_bf16),
        "bf16 oneDNN packed for 16 rows": onednn(packed_bf16_16),
        "bf16 packed, rows padded to 16": _padded(onednn(packed_bf16), 16),
        "bf16 packed, rows padded to 32": _padded(onednn(packed_bf16), 32),
    }


def quantized_options(w: torch.Tensor) -> dict[str, Matmul]:
    """torch's weight-only int8 and int4 kernels (bf16 activations), for context."""
    from ssd.layers.quantized_linear import Int4Matmul, Int8Matmul
    from ssd.quantized_weights import quantize_int4, quantize_int8

    cpu = torch.device("cpu")
    int8 = Int8Matmul(quantize_int8(w), torch.bfloat16, cpu)
    int4 = Int4Matmul(quantize_int4(w, 32), torch.bfloat16, cpu)
    return {"int8 _weight_int8pack_mm": int8.kernel, "int4 g32 _weight_int4pack_mm_for_cpu": int4.kernel}


class _Stack(nn.Module):
    """`LAYERS` bias-free linears of one shape applied to one input: what inductor compiles per shape."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(w.shape[1], w.shape[0], bias=False) for w in weights)
        for linear, w in zip(self.linears, weights, strict=True):
            linear.weight = nn.Parameter(w.bfloat16(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:  # x [M, K] -> LAYERS x [M, N]
        return [linear(x) for linear in self.linears]


def compiled_stack(weights: list[torch.Tensor], rows: int) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """inductor max-autotune (its C++ GEMM template vs aten), weights frozen as constants, for `rows` rows."""
    import torch._inductor.config as inductor

    inductor.freezing = True  # the C++ GEMM template wants constant weights, packed at compile time
    inductor.max_autotune_gemm_backends = "CPP,ATEN"
    torch._dynamo.config.recompile_limit = 64  # one graph per (shape, rows): more than dynamo's default 8
    stack = _Stack(weights).eval()
    fn = torch.compile(stack, mode="max-autotune", dynamic=False, fullgraph=True)
    with torch.no_grad():
        fn(torch.zeros(rows, weights[0].shape[1], dtype=torch.bfloat16))
    return fn


def build(args: argparse.Namespace) -> tuple[dict, dict]:
    """Per shape: option -> a pass over that shape's weights (LAYERS of them, or one LM head)."""
    torch.manual_seed(0)
    passes: dict[str, dict[str, Callable[[torch.Tensor], object]]] = {}
    weights: dict[str, list[torch.Tensor]] = {}
    for name, (n, k) in SHAPES.items():
        count = 1 if name == "lm_head" else LAYERS
        weights[name] = [torch.randn(n, k) * 0.05 for _ in range(count)]
        per_weight = [float_options(w) | (quantized_options(w) if args.quantized else {}) for w in weights[name]]
        passes[name] = {opt: (lambda x, fns=[p[opt] for p in per_weight]: [f(x) for f in fns])
                        for opt in per_weight[0]}
    return passes, weights


def time_pass(fn: Callable[[torch.Tensor], object], x: torch.Tensor, reps: int) -> float:
    """ms of the best of `reps` calls after one warm-up."""
    fn(x)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def measure(args: argparse.Namespace, rows: int, passes: dict, weights: dict) -> dict[str, dict[str, float]]:
    """option -> shape -> best ms of one pass, for `rows` rows."""
    local = {name: dict(opts) for name, opts in passes.items()}
    if args.compile:
        for name in SHAPES:
            started = time.perf_counter()
            local[name]["bf16 inductor max-autotune"] = compiled_stack(weights[name], rows)
            print(json.dumps({"compiled": name, "rows": rows, "s": round(time.perf_counter() - started, 1)}),
                  flush=True)
    best: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, opts in local.items():
                x = torch.randn(rows, SHAPES[name][1]).bfloat16()
                for option, fn in opts.items():
                    t = time_pass(fn, x, args.reps)
                    cell = best.setdefault(option, {})
                    cell[name] = min(cell.get(name, float("inf")), t)
    return best


def report(rows: int, best: dict[str, dict[str, float]], bandwidth: float) -> list[dict]:
    out = []
    for option, t in best.items():
        width = 4 if option.startswith("fp32") else 1 if option.startswith("int8") else 0.5 if "int4" in option else 2
        total_ms = sum(t.values())
        bytes_all = sum(n * k * width * (1 if s == "lm_head" else LAYERS) for s, (n, k) in SHAPES.items())
        gbs = bytes_all / (total_ms * 1e6)
        row = {"rows": rows, "option": option, "total_ms": round(total_ms, 2), "gb_s": round(gbs, 1),
               "of_copy": round(gbs / bandwidth, 2), **{f"{s}_ms": round(v, 2) for s, v in t.items()}}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,5,8,16", help="comma-separated row counts (1 = a decode step)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the best counts")
    parser.add_argument("--reps", type=int, default=3, help="passes per option per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="also inductor max-autotune (minutes per row count)")
    parser.add_argument("--no-quantized", dest="quantized", action="store_false", help="skip int8 / int4")
    parser.add_argument("--json", help="also write all rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bandwidth = copy_gbs(5)
    print(json.dumps({"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": args.threads,
                      "copy_gb_s": round(bandwidth, 1), "torch": torch.__version__}), flush=True)
    passes, weights = build(args)
    rows = []
    for m in (int(r) for r in args.rows.split(",")):
        rows += report(m, measure(args, m, passes, weights), bandwidth)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gb_s": bandwidth, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
