"""Time paged decode attention on a CUDA GPU: the Triton kernel, flash-attn, and the engine's gather path.

    python -m bench.attention_kernels --batches 1,8,64 --contexts 512,4096,32768 --output attention.json

Llama-3.1-8B head shape by default (32 query heads, 8 KV heads, D=128, block 16), one layer, one query per
sequence. Each time is set against the floor of reading that layer's K/V once at the device's copy bandwidth
(measured with a large device-to-device copy unless --bandwidth-gbs is given). flash-attn's paged KV wants
its own layout ([blocks, block, KVH, D]) and block size (a multiple of 256 in flash-attn 2), so it gets its
own cache of the same keys. Times are means over --iters back-to-back calls, launch overhead included (it
dominates at batch 1 and short contexts). Needs CUDA; prints a table and writes JSON.
"""

import argparse
import json
import sys
from collections.abc import Callable

import torch

from ssd.context import ForwardContext, ForwardMode
from ssd.layers.padded_attention import paged_attention as engine_paged_attention
from ssd_kernels.paged_attention import paged_attention


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = _int_list
    p.add_argument("--batches", type=ints, default=[1, 8, 64], help="comma-separated batch sizes")
    p.add_argument("--contexts", type=ints, default=[512, 4096, 32768], help="comma-separated keys per seq")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--flash-block-size", type=int, default=256, help="flash-attn's page size")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="use this GB/s, not a copy measured")
    p.add_argument("--skip-gather", action="store_true", help="skip the gather path (big at 64 x 32k)")
    p.add_argument("--output", default="attention_kernels.json")
    args = p.parse_args(argv)
    if args.heads % args.kv_heads or min(args.batches + args.contexts) < 1:
        p.error("--heads must be a multiple of --kv-heads, and batches and contexts positive")
    return args


def cuda_ms(fn: Callable[[], object], iters: int) -> float:
    """Mean milliseconds of `fn` over `iters` calls after two warm-up calls (CUDA events)."""
    fn(), fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth_gbs(iters: int) -> float:
    """Device copy bandwidth, GB/s counting the read and the write, over a 2 GiB buffer."""
    src = torch.empty(2**30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src), iters)
    return 2 * src.numel() * src.element_size() / (ms * 1e6)


def flash_call(
    q: torch.Tensor, cache: "PagedCache", scale: float, block_size: int
) -> Callable[[], object] | str:
    """A closure running flash_attn_with_kvcache on its own paged copy of `cache`, or why it cannot run."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return "flash-attn not installed"
    if block_size % cache.block_size:
        return f"--flash-block-size must be a multiple of {cache.block_size}"
    block_tables, seq_lens = cache.block_tables, cache.seq_lens
    num_seqs = block_tables.shape[0]
    blocks = -(-block_tables.shape[1] // (block_size // cache.block_size))
    # [blocks, block, KVH, D]: sequence b's flash blocks are b*blocks .. (b+1)*blocks-1
    k = torch.zeros(num_seqs * blocks * block_size, *cache.k.shape[::2], dtype=cache.k.dtype, device="cuda")
    v = torch.zeros_like(k)
    for b in range(num_seqs):
        positions = torch.arange(int(seq_lens[b]), device="cuda")
        slots = cache.slots(positions)[b]  # [n]
        k[b * blocks * block_size + positions] = cache.k[:, slots].transpose(0, 1)
        v[b * blocks * block_size + positions] = cache.v[:, slots].transpose(0, 1)
    k, v = (t.view(num_seqs * blocks, block_size, *t.shape[1:]) for t in (k, v))
    table = torch.arange(num_seqs * blocks, dtype=torch.int32, device="cuda").view(num_seqs, blocks)
    return lambda: flash_attn_with_kvcache(q[:, None], k, v, cache_seqlens=seq_lens, block_table=table,
                                           softmax_scale=scale, causal=True)


class PagedCache:
    """One layer's head-major cache [2, KVH, slots, D] holding `num_seqs` sequences of `context` keys."""

    def __init__(self, num_seqs: int, context: int, args: argparse.Namespace, dtype: torch.dtype) -> None:
        self.block_size = args.block_size
        blocks_per_seq = -(-context // args.block_size)
        num_blocks = num_seqs * blocks_per_seq
        self.kv = torch.randn(2, args.kv_heads, num_blocks * args.block_size, args.head_dim, dtype=dtype,
                              device="cuda")
        self.k, self.v = self.kv[0], self.kv[1]
        perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
        self.block_tables = perm.view(num_seqs, blocks_per_seq)  # [B, blocks] scattered blocks
        self.seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device="cuda")

    def slots(self, positions: torch.Tensor) -> torch.Tensor:  # [B, len(positions)] int64
        table = self.block_tables.long()
        return table[:, positions // self.block_size] * self.block_size + positions % self.block_size

    def engine_context(self, context: int) -> ForwardContext:
        positions = torch.arange(context, device="cuda")  # [S]
        slots = self.slots(positions)  # [B, S]
        return ForwardContext(mode=ForwardMode.DECODE, slot_mapping=slots[:, -1], kv_slots=slots,
                              attn_mask=None, query_index=None, token_batch=None, token_offset=None)


def time_case(num_seqs: int, context: int, args: argparse.Namespace, bandwidth_gbs: float) -> dict:
    dtype = getattr(torch, args.dtype)
    cache = PagedCache(num_seqs, context, args, dtype)
    q = torch.randn(num_seqs, args.heads, args.head_dim, dtype=dtype, device="cuda")  # [T=B, H, D]
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device="cuda")
    scale = args.head_dim**-0.5
    kv_bytes = cache.kv[:, :, : num_seqs * context].numel() * cache.kv.element_size()
    row = {"batch": num_seqs, "context": context, "kv_mb": round(kv_bytes / 2**20, 1),
           "floor_ms": round(kv_bytes / (bandwidth_gbs * 1e6), 4)}
    row["triton_ms"] = round(cuda_ms(lambda: paged_attention(
        q, cache.k, cache.v, cache.block_tables, cache.seq_lens, query_start_loc, 1, scale,
        block_size=args.block_size), args.iters), 4)
    flash = flash_call(q, cache, scale, args.flash_block_size)
    row["flash_ms"] = flash if isinstance(flash, str) else round(cuda_ms(flash, args.iters), 4)
    if not args.skip_gather:
        ctx = cache.engine_context(context)
        gather = lambda: engine_paged_attention(q, cache.kv, ctx, scale)  # noqa: E731
        row["gather_ms"] = round(cuda_ms(gather, args.iters), 4)
    return row  # the caches go with this frame


def print_table(rows: list[dict]) -> None:
    columns = ["batch", "context", "kv_mb", "floor_ms", "triton_ms", "flash_ms", "gather_ms"]
    print(" ".join(f"{c:>12}" for c in columns))
    for row in rows:
        print(" ".join(f"{str(row.get(c, '-'))[:12]:>12}" for c in columns))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench.attention_kernels times CUDA kernels: no CUDA device is visible here")
    bandwidth = args.bandwidth_gbs or copy_bandwidth_gbs(args.iters)
    rows = []
    for num_seqs in args.batches:
        for context in args.contexts:
            rows.append(time_case(num_seqs, context, args, bandwidth))
            torch.cuda.empty_cache()  # the next case may need the memory this one's caches held
    print(f"{torch.cuda.get_device_name()}  copy bandwidth {bandwidth:.0f} GB/s  {args.dtype}  "
          f"H={args.heads} KVH={args.kv_heads} D={args.head_dim} block={args.block_size}")
    print_table(rows)
    with open(args.output, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "bandwidth_gbs": bandwidth, "args": vars(args),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
