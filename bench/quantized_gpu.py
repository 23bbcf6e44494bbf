"""Quantized weights at a real model's shape (issue 29, its GPU part): the engine's decode step of a
Llama-3.1-8B-shaped model with random weights, bfloat16 against int8 and int4 weights, at batch 1 and 8, against the
byte floor.

    python3 -m bench.quantized_gpu --json bench/results/quantized_gpu_h200.json      # on the GPU machine
    python -m bench.quantized_gpu --device cpu --layers 2 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 \
        --vocab 1024 --context 32 --steps 4                                              # a smoke run anywhere

It writes a random bfloat16 checkpoint of the shape to a temp folder (one safetensors file per few layers; the
tensors are drawn on the device), then for each quantization in turn (none, int8, int4) builds one engine on the
device (int8 / int4: quantized at load from that checkpoint, as `--quantization` does for any HF checkpoint; the
loader quantizes on the host, so the int4 and int8 loads take a minute or two at 8B; `--layers 8` keeps the layer
shapes and takes a quarter of the time),
checks that its quantized linears run a kernel and agree with their dequantizing reference on one layer, and times
decode steps of random prompts at each batch size (`bench.decode_step.decode_ms_per_step`, the best of `--rounds`).
The floor is the bytes the step must read (the weights in their format, the LM head, and the K and V of the batch at
its mean context) over the device's copy bandwidth (read + written bytes of a large device-to-device copy).
Acceptance is meaningless on random weights; the timings are real. One engine lives at a time (sized to the largest
batch), so the GPU's memory holds one 8B model at once.
"""

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.decode_step import decode_ms_per_step, read_bandwidth_gb_s
from ssd.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from ssd.layers.quantized_linear import Int4Matmul, Int8Matmul, int4_kernels
from ssd.llm import LLM

LAYERS_PER_FILE = 4


def write_random_llama(folder: Path, args: argparse.Namespace, device: str) -> None:
    """config.json + safetensors shards of a random Llama of the given shape (bfloat16, std 0.02, norms at 1)."""
    head_dim = args.hidden // args.heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": args.hidden,
              "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
              "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "head_dim": head_dim,
              "vocab_size": args.vocab, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    generator = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:  # drawn on the device (fast), stored from the host
        return (0.02 * torch.randn(*shape, generator=generator, device=device)).to(torch.bfloat16).cpu()

    q_out, kv_out = args.heads * head_dim, args.kv_heads * head_dim
    shapes = {"self_attn.q_proj": (q_out, args.hidden), "self_attn.k_proj": (kv_out, args.hidden),
              "self_attn.v_proj": (kv_out, args.hidden), "self_attn.o_proj": (args.hidden, q_out),
              "mlp.gate_proj": (args.intermediate, args.hidden), "mlp.up_proj": (args.intermediate, args.hidden),
              "mlp.down_proj": (args.hidden, args.intermediate)}
    weight_map: dict[str, str] = {}
    for first in range(0, args.layers, LAYERS_PER_FILE):
        shard: dict[str, torch.Tensor] = {}
        for i in range(first, min(first + LAYERS_PER_FILE, args.layers)):
            for name, shape in shapes.items():
                shard[f"model.layers.{i}.{name}.weight"] = rand(*shape)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                shard[f"model.layers.{i}.{norm}.weight"] = torch.ones(args.hidden, dtype=torch.bfloat16)
        _save(folder, f"layers-{first:03d}.safetensors", shard, weight_map)
    ends = {"model.embed_tokens.weight": rand(args.vocab, args.hidden), "lm_head.weight": rand(args.vocab, args.hidden),
            "model.norm.weight": torch.ones(args.hidden, dtype=torch.bfloat16)}
    _save(folder, "ends.safetensors", ends, weight_map)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _save(folder: Path, name: str, tensors: dict[str, torch.Tensor], weight_map: dict[str, str]) -> None:
    save_file(tensors, str(folder / name), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(tensors, name))


def weight_read_bytes(llm: LLM) -> int:
    """Bytes of weights a decode step reads: each quantized linear in its format (int4: codes, a scale and a zero per
    group; int8: codes, a scale per row; it may hold its codes in more than one layout, and reads one), every float
    parameter (linears, the LM head, norms), but of the input embedding only a row per sequence, so none."""
    total = 0
    for module in llm.engine.model.modules():
        if isinstance(module, Int4Matmul):
            groups = module.in_features // module.group_size
            total += module.out_features * module.in_features // 2 + 2 * groups * module.out_features * 2
        elif isinstance(module, Int8Matmul):
            total += module.codes.numel() + module.scales.numel() * module.scales.element_size()
        elif not isinstance(module, VocabParallelEmbedding) or isinstance(module, ParallelLMHead):
            total += sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
    return total


def kv_read_bytes(args: argparse.Namespace, batch: int) -> int:
    """Bytes of K and V a step reads at the run's mean context (bfloat16)."""
    head_dim = args.hidden // args.heads
    context = args.context + args.steps // 2
    return batch * context * args.layers * 2 * args.kv_heads * head_dim * 2


def kernel_check(llm: LLM) -> dict:
    """What the quantized linears run on, and the largest difference of one layer's kernel from its reference."""
    model = llm.engine.model
    int4 = [m for m in model.modules() if isinstance(m, Int4Matmul)]
    int8 = [m for m in model.modules() if isinstance(m, Int8Matmul)]
    out: dict = {"int4_kernels": int4_kernels(model),
                 "int8_kernel": None if not int8 else ("int8pack" if all(m.has_kernel for m in int8) else "reference")}
    layer = (int4 or int8 or [None])[0]
    if layer is not None:
        x = torch.randn(8, layer.in_features, dtype=torch.bfloat16, device=llm.engine.config.device,
                        generator=torch.Generator(device=llm.engine.config.device).manual_seed(1))
        got, want = layer(x).float(), layer.reference(x).float()
        out["max_abs_diff_vs_reference"] = float((got - want).abs().max())
        out["reference_max_abs"] = float(want.abs().max())
    return out


def run(args: argparse.Namespace, folder: Path, bandwidth: float) -> list[dict]:
    """One row per quantization and batch size; `bandwidth`: the device's copy bandwidth, GB/s."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, args.vocab, (args.context,), generator=generator).tolist()
               for _ in range(max(args.batch))]
    rows = []
    for quantization in args.quantization:
        started = time.perf_counter()
        llm = LLM(str(folder), dtype="bfloat16", device=args.device, quantization=quantization,
                  max_num_seqs=max(args.batch), enable_prefix_caching=False, kv_cache_memory_mb=args.kv_cache_mb)
        load_s, check, weight_bytes = time.perf_counter() - started, kernel_check(llm), weight_read_bytes(llm)
        for batch in args.batch:
            times = [decode_ms_per_step(llm, prompts[:batch], batch, args.steps) for _ in range(args.rounds)]
            ms, kv_bytes = min(times), kv_read_bytes(args, batch)
            floor_ms = (weight_bytes + kv_bytes) / bandwidth / 1e6
            rows.append({"quantization": quantization, "batch": batch, "ms_per_step": round(ms, 3),
                         "decode_tok_s": round(1000 * batch / ms, 1), "rounds_ms": [round(t, 3) for t in times],
                         "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "floor_ms": round(floor_ms, 3),
                         "x_floor": round(ms / floor_ms, 2), "load_s": round(load_s, 1), **check})
            print(json.dumps(rows[-1]), flush=True)
        llm.close()
        del llm
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--quantization", type=lambda s: s.split(","), default=["none", "int8", "int4"])
    p.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    p.add_argument("--context", type=int, default=256, help="tokens per random prompt")
    p.add_argument("--steps", type=int, default=64, help="decode steps timed per prompt group")
    p.add_argument("--rounds", type=int, default=2, help="timed passes per engine (the best counts)")
    p.add_argument("--kv-cache-mb", type=int, default=2048)
    p.add_argument("--folder", default=None, help="write (or reuse) the random checkpoint here; default: a temp folder")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ssd-quantized-gpu-") as scratch:
        folder = Path(args.folder or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        if not (folder / "config.json").is_file():
            write_random_llama(folder, args, args.device)
        written_s = time.perf_counter() - started
        bandwidth = 2 * read_bandwidth_gb_s(2048, device=args.device)  # read + written bytes of a copy
        rows = run(args, folder, bandwidth)
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
              "torch": torch.__version__, "shape": {k: getattr(args, k) for k in
                                                    ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")},
              "context": args.context, "steps": args.steps, "checkpoint_write_s": round(written_s, 1),
              "copy_gb_s": round(bandwidth, 1), "runs": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
