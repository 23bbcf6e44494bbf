"""Quantized weights on the default model: decode speed, the linears' cost per token, and quality.

    python -m bench.quantized_decode speed   # tokens/s: float vs int8 vs int4 (the GGUF's own), batch 1 / 8
    python -m bench.quantized_decode linears # ms per token of all the model's linear shapes, per matmul option
    python -m bench.quantized_decode quality # int4 (own Q4_1) vs the dequantized float model: match rate, KL

Every configuration is measured in this one process, interleaved round by round (the best round counts), so
ratios hold on a shared machine even where absolute numbers do not. A speed config may carry variants after a
slash: `/torch-ops` runs it with the project's CPU layer ops off (the layers' plain torch ops), `/float-head` with
its LM head on the float weight rather than the checkpoint's Q8_0 blocks, `/op-by-op` with the layer ops on but
each decoder layer run op by op instead of as one fused call (ssd/layers/fused_layer.py), `/layer-calls` with each
fused layer its own call instead of the whole stack as one (ssd/layers/fused_stack.py), `/onednn` with the float
linears on oneDNN's packed GEMM instead of the own float kernels (ssd_kernels/cpu/bf16_gemm, dense_gemm), `/no-amx`
with the own bfloat16 and quantized kernels on their AVX512-BF16 loops where the CPU has AMX-BF16 (the default there:
AMX tiles, for the quantized kernels from batch 3 on: each batch size gets engines of that max_num_seqs); e.g.

    python -m bench.quantized_decode speed --configs bf16,int4-own-fp32,int4-own-fp32/torch-ops/float-head
"""

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.datasets import load_prompts
from bench.runner import render_prompts
from ssd.context import ForwardMode
from ssd.layers import cpu_kernels
from ssd.llm import LLM
from ssd.model_store import DEFAULT_MODEL
from ssd.runtime.model_runner import ForwardItem
from ssd.sampling.params import SamplingParams

# (name, dtype, quantization); bf16 float runs on oneDNN-packed weights (the engine's default linear backend).
# int4-own: the GGUF's own Q4_1 weights on the project's CPU kernel (ssd_kernels/cpu/int4_gemm); int4-torch: the same
# weights on torch's _weight_int4pack_mm_for_cpu (bf16 scales); the -fp32 ones in float32 activations, where
# int4-torch-fp32 is the dequantizing reference (torch has no fast float32 int4 kernel on CPU).
# int4-own-int8act: the own kernel's VNNI path (activations rounded to int8 in groups of 32, as llama.cpp).
SPEED_CONFIGS = [("bf16", "bfloat16", "none"), ("int8", "bfloat16", "int8"), ("int4-own", "bfloat16", "auto"),
                 ("int4-own-int8act", "bfloat16", "auto"), ("int4-torch", "bfloat16", "auto"),
                 ("fp32", "float32", "none"), ("int4-own-fp32", "float32", "auto"), ("int4-torch-fp32", "float32", "auto")]
VARIANTS = ("torch-ops", "float-head", "op-by-op", "layer-calls", "onednn", "no-amx")


def _speed_config(name: str) -> tuple[str, str, list[str]]:
    """(dtype, quantization, variants) of a --configs entry such as `int4-own-fp32/torch-ops`."""
    base, *variants = name.split("/")
    found = {n: (dtype, q) for n, dtype, q in SPEED_CONFIGS}.get(base)
    unknown = [v for v in variants if v not in VARIANTS]
    if found is None or unknown:
        sys.exit(f"unknown speed config {name!r}: a base of {[c[0] for c in SPEED_CONFIGS]}, then any of "
                 f"{', '.join('/' + v for v in VARIANTS)}")
    return *found, variants


def _speed_llm(args: argparse.Namespace, name: str, dtype: str, quantization: str, threads: int, batch: int) -> LLM:
    """One config's engine for decode batches of `batch` (its max_num_seqs: the quantized kernels choose their path by
    the rows a decode forward carries, ssd/layers/cpu_kernels.py `quantized_bf16_path`)."""
    from ssd.layers.quantized_linear import Int4Kernel, Int4Matmul

    variants = name.split("/")
    cpu_kernels.set_own_float_kernels("onednn" not in variants, "no-amx" not in variants)  # read at packing
    llm = LLM(args.model, dtype=dtype, quantization=quantization, num_threads=threads, max_num_seqs=batch,
              enable_prefix_caching=False,  # the timed run must prefill again, as the first did
              kv_cache_memory_mb=256)  # 8 x 64 tokens need ~20 MB; several engines live in this one process
    cpu_kernels.set_own_float_kernels(True)
    base = name.split("/")[0]
    choice = {"int4-own": Int4Kernel.OWN, "int4-own-int8act": Int4Kernel.OWN_INT8, "int4-torch": Int4Kernel.TORCH,
              "int4-torch-fp32": Int4Kernel.TORCH}.get(base, Int4Kernel.AUTO)
    if "float-head" in name.split("/"):
        llm.engine.model.lm_head.q8_blocks = llm.engine.model.lm_head.q8_bf16_blocks = None
    if "layer-calls" in name.split("/"):  # each fused layer its own call, not the stack as one
        llm.engine.model.model.fused_stack = None
    if "op-by-op" in name.split("/"):
        for layer in llm.engine.model.model.layers:
            layer.fused = None
    for module in llm.engine.model.modules():
        if isinstance(module, Int4Matmul):
            module.kernel_choice = choice
    return llm


def _decode_rate(llm: LLM, prompts: list[list[int]], batch: int, output_len: int) -> float:
    """Decode tokens/s of `batch` prompts together: (all tokens - first ones) / (time - time to first token)."""
    group = prompts[:batch]
    start = time.perf_counter()
    llm.generate(group, SamplingParams(max_tokens=1, ignore_eos=True))
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(group, SamplingParams(max_tokens=output_len, ignore_eos=True))
    total_s = time.perf_counter() - start
    return batch * (output_len - 1) / max(total_s - prefill_s, 1e-9)


def speed(args: argparse.Namespace) -> dict:
    prompts = load_prompts("all", 4)  # 4 MT-Bench + 4 HumanEval: the batch of 8
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        configs = {name: _speed_config(name) for name in dict.fromkeys(["bf16", *args.configs])}
        for batch in args.batch:
            llms = {name: _speed_llm(args, name, dtype, q, threads, batch) for name, (dtype, q, _) in configs.items()}
            encoded = render_prompts(llms["bf16"], prompts)
            best = dict.fromkeys(llms, 0.0)
            for _ in range(args.rounds):
                for name, llm in llms.items():
                    cpu_kernels.set_layer_ops("torch-ops" not in configs[name][2])
                    best[name] = max(best[name], _decode_rate(llm, encoded, batch, args.output_len))
            cpu_kernels.set_layer_ops(True)
            row = {"threads": threads, "batch": batch, **{f"{k}_tok_s": round(v, 1) for k, v in best.items()}}
            row |= {f"{k}_vs_bf16": round(v / best["bf16"], 2) for k, v in best.items()}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del llms
    return {"speed": rows}


LINEAR_SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)


def _time_ms(fn: Callable[[], torch.Tensor], reps: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def _linear_options(w: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    from ssd.layers.quantized_linear import Int4Matmul, Int8Matmul
    from ssd.quantized_weights import quantize_int4, quantize_int8

    cpu = torch.device("cpu")
    bf16, fp32 = w.bfloat16(), w.float()
    packed_bf16 = torch.ops.mkldnn._reorder_linear_weight(bf16, 1)
    packed_fp32 = torch.ops.mkldnn._reorder_linear_weight(fp32, 1)
    int8, int4 = Int8Matmul(quantize_int8(w), torch.bfloat16, cpu), Int4Matmul(quantize_int4(w, 32), torch.bfloat16, cpu)
    return {
        "fp32 F.linear": lambda x: F.linear(x.float(), fp32),
        "fp32 oneDNN packed": lambda x: torch.ops.mkldnn._linear_pointwise(x.float(), packed_fp32, None, "none", [], ""),
        "bf16 F.linear": lambda x: F.linear(x, bf16),
        "bf16 oneDNN packed": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed_bf16, None, "none", [], ""),
        "bf16 rows padded to 16, packed": lambda x: torch.ops.mkldnn._linear_pointwise(
            F.pad(x, (0, 0, 0, 16 - x.shape[0])), packed_bf16, None, "none", [], "")[: x.shape[0]],
        "int8 (bf16 x)": int8.kernel,
        "int4 g32 (bf16 x)": int4.kernel,
    }


def linears(args: argparse.Namespace) -> dict:
    """ms per token of the 30 layers' linears and the LM head, one thread, per option and row count."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = {name: torch.randn(n, k) * 0.05 for name, (n, k) in {**LINEAR_SHAPES, "lm_head": LM_HEAD}.items()}
    options = {name: _linear_options(w) for name, w in weights.items()}
    rows = []
    for m in args.batch:
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for name, opts in options.items():
                x = torch.randn(m, weights[name].shape[1]).bfloat16()
                for option, fn in opts.items():
                    t = _time_ms(lambda fn=fn, x=x: fn(x), 20 if name == "lm_head" else 100)
                    cell = best.setdefault(option, {})
                    cell[name] = min(cell.get(name, float("inf")), t)
        for option, t in best.items():
            layers = 30 * sum(t[n] for n in LINEAR_SHAPES)
            row = {"rows": m, "option": option, "layers_ms": round(layers, 2), "lm_head_ms": round(t["lm_head"], 2)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"linears": rows}


def _logits(llm: LLM, ids: list[int]) -> torch.Tensor:  # [len(ids), V] float32: next-token logits everywhere
    class Seq:
        def __init__(self) -> None:
            self.block_table, self.num_cached_tokens, self.num_hashed_blocks = [], 0, 0

    seq, bm = Seq(), llm.engine.block_manager
    bm.ensure_capacity(seq, len(ids))
    try:
        item = ForwardItem(ids, 0, seq.block_table, num_logits=len(ids))
        return llm.engine.runner.forward([item], ForwardMode.PREFILL).logits
    finally:
        bm.free(seq)


def quality(args: argparse.Namespace) -> dict:
    """Teacher-forced on the float32 float model's greedy answers: how often int4's argmax (in `--dtype`)
    agrees, and mean KL(p || q). In float32 int4 dequantizes to the GGUF's values: the two models are one."""
    torch.set_num_threads(args.threads[0])
    ref = LLM(args.model, dtype="float32", enable_prefix_caching=False)  # the exact dequantized model
    own = LLM(args.model, dtype=args.dtype, quantization=args.quantization, enable_prefix_caching=False)
    results = {}
    for dataset in ("mtbench", "humaneval"):
        matches = total = 0
        kl_sum = 0.0
        for ids in render_prompts(ref, load_prompts(dataset, args.numseqs)):
            answer = ref.generate([ids], SamplingParams(max_tokens=args.output_len))[0].token_ids
            seq = ids + answer
            p_logits, q_logits = _logits(ref, seq)[len(ids) - 1 : -1], _logits(own, seq)[len(ids) - 1 : -1]
            matches += int((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
            total += len(answer)
            kl = F.kl_div(q_logits.log_softmax(-1), p_logits.log_softmax(-1), log_target=True, reduction="none")
            kl_sum += float(kl.sum(-1).sum())
        results[dataset] = {"positions": total, "greedy_match_rate": round(matches / total, 4),
                            "mean_kl": round(kl_sum / total, 5)}
        print(json.dumps({dataset: results[dataset]}), flush=True)
    return {"quality": results, "dtype": args.dtype, "quantization": args.quantization, "reference_dtype": "float32"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.quantized_decode", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["speed", "linears", "quality"])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--numseqs", type=int, default=8, help="quality: prompts per data set")
    p.add_argument("--dtype", default="float32", help="quality: the int4 model's activation dtype")
    p.add_argument("--quantization", default="auto", help="quality: the compared model's (none: a dtype baseline)")
    p.add_argument("--configs", type=lambda s: s.split(","), default=[c[0] for c in SPEED_CONFIGS],
                   help="speed: which of " + ", ".join(c[0] for c in SPEED_CONFIGS) + ", each with optional variants "
                   "(" + ", ".join("/" + v for v in VARIANTS) + "; bf16 is always run)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    doc = {"speed": speed, "linears": linears, "quality": quality}[args.what](args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
