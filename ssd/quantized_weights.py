"""Quantized weights in their portable form: int4 (grouped) and int8 (per channel), made from float weights or
read from a GGUF's own 4-bit blocks without dequantizing, and cached on disk beside the float checkpoint.

Portable form: output features on dim 0, input features on dim 1 (so the layers' weight loaders shard it like
a float weight); ssd/layers/quantized_linear.py makes each device kernel's own layout from it at load.
int4 convention (torch's int4pack kernels): w = (q - 8) * scale + zero, q in 0..15, one (scale, zero) per
`group_size` input features; codes pack two per byte, the even input feature in the high nibble. GGUF Q4_1
(w = d * q + m) maps exactly to scale = d, zero = m + 8 d; Q4_0 (w = d * (q - 8)) to scale = d, zero = 0.

`import_gguf_int4` (run by `ssd models pull`) undoes llama.cpp's q/k row order, names each tensor as the HF
checkpoint does and writes `quantized_int4.safetensors` into the model folder. It also keeps the GGUF's Q8_0
output weight (`output.weight`, or the tied `token_embd.weight`) as a `Q8Weight` in `quantized_head_q8_0.safetensors`:
the LM head reads it per token (ssd/layers/embedding.py), the embedding lookup stays on the float folder's copy.
Float norms stay in the float folder only.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ssd.errors import CheckpointError

log = structlog.get_logger(__name__)

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4pack kernels take


@dataclass(frozen=True)
class Int4Weight:
    """A grouped int4 weight in its portable form."""

    codes: torch.Tensor  # [N, K / 2] uint8: q of input feature 2j in the high nibble, 2j + 1 in the low one
    scales: torch.Tensor  # [N, K / group_size] float32
    zeros: torch.Tensor  # [N, K / group_size] float32, in the (q - 8) * scale + zero convention

    @property
    def group_size(self) -> int:
        return 2 * self.codes.shape[1] // self.scales.shape[1]

    def unpacked(self) -> torch.Tensor:  # [N, K] uint8, 0..15
        return unpack_int4_codes(self.codes)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:  # [N, K]
        n, num_groups = self.scales.shape
        q = self.unpacked().view(n, num_groups, -1).to(dtype)  # [N, G, g]
        w = (q - 8) * self.scales.to(dtype)[..., None] + self.zeros.to(dtype)[..., None]
        return w.view(n, -1)


@dataclass(frozen=True)
class Int8Weight:
    """A symmetric per-output-channel int8 weight: w = q * scale."""

    codes: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N] float32

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        return self.codes.float() * self.scales[:, None]


@dataclass(frozen=True)
class Q8Weight:
    """A symmetric group-32 int8 weight (GGUF Q8_0): w = q * scale, one scale per 32 input features."""

    codes: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N, K / 32] float32 (fp16 values in a GGUF)

    def dequantize(self) -> torch.Tensor:  # [N, K] float32 (exact: an int8 times an fp16)
        n, k = self.codes.shape
        return (self.codes.view(n, -1, GGUF_BLOCK).float() * self.scales[..., None]).view(n, k)


def unpack_int4_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K / 2] uint8 -> q [N, K] uint8 in 0..15 (the inverse of `pack_int4_codes`)."""
    return torch.stack([codes >> 4, codes & 0xF], dim=-1).flatten(1)


def pack_int4_codes(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] integers in 0..15 -> [N, K / 2] uint8, the even input feature in the high nibble."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] << 4) | q[:, 1::2]


def quantize_int4(weight: torch.Tensor, group_size: int) -> Int4Weight:
    """Asymmetric min/max int4 of weight [N, K] in groups of `group_size` input features, as GGUF Q4_1 does it:
    each group's scale and minimum are fp16 values, so the project's CPU int4 kernel holds them exactly."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)  # [N, G, g]
    low, high = groups.amin(-1).half().float(), groups.amax(-1)  # [N, G]
    scales = ((high - low) / 15).half().float()
    q = ((groups - low[..., None]) / scales.clamp_min(1e-30)[..., None]).round().clamp(0, 15)  # [N, G, g]
    return Int4Weight(pack_int4_codes(q.reshape(n, k)), scales, low + 8 * scales)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 of weight [N, K]."""
    w = weight.float()
    scales = w.abs().amax(1) / 127  # [N]
    q = (w / scales.clamp_min(1e-30)[:, None]).round().clamp(-127, 127).to(torch.int8)
    return Int8Weight(q, scales)


def quantize_q8_0(weight: torch.Tensor) -> Q8Weight:
    """GGUF Q8_0 of weight [N, K]: int8 in groups of 32, one fp16 scale each (d = amax / 127, as llama.cpp)."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // GGUF_BLOCK, GGUF_BLOCK)  # [N, G, 32]
    d = (groups.abs().amax(-1) / 127).half().float()  # [N, G]
    q = (groups / d.clamp_min(1e-30)[..., None]).round().clamp(-127, 127).to(torch.int8)
    return Q8Weight(q.reshape(n, k), d)


CACHE_NAME = "quantized_int4.safetensors"
GGUF_BLOCK = 32  # Q4_0 / Q4_1 quantize 32 input features per block
_GGUF_NAMES = {  # blk.{i}.<gguf> -> model.layers.{i}.<hf>
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_PARTS = ("codes", "scales", "zeros")  # the Int4Weight fields, in order
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def decode_q4_blocks(raw: np.ndarray, kind: str) -> Int4Weight:
    """raw [N, K / 32 * block bytes] uint8 of GGUF Q4_0 / Q4_1 rows -> the same values as an Int4Weight.

    A block is d (fp16), [m (fp16), Q4_1 only], then 16 bytes: byte j holds q_j (low nibble) and q_{j+16}.
    """
    has_min = kind == "Q4_1"
    header = 4 if has_min else 2
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, header + 16)  # [N, B, bytes]
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0]).float()  # [N, B]
    qs = torch.from_numpy(blocks[..., header:].copy())  # [N, B, 16]
    q = torch.cat([qs & 0xF, qs >> 4], dim=-1).reshape(n, -1)  # [N, K]: per block q_0..q_15, q_16..q_31
    if has_min:
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]).float()  # [N, B]
        zeros = m + 8 * d  # d * q + m == (q - 8) * d + (m + 8 d)
    else:
        zeros = torch.zeros_like(d)  # d * (q - 8)
    return Int4Weight(pack_int4_codes(q), d, zeros)


def decode_q8_blocks(raw: np.ndarray) -> Q8Weight:
    """raw [N, K / 32 * 34] uint8 of GGUF Q8_0 rows (per block: d as fp16, then 32 int8 codes) -> a Q8Weight."""
    blocks = raw.reshape(raw.shape[0], -1, 34)  # [N, B, bytes]
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0]).float()  # [N, B]
    q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(raw.shape[0], -1)  # [N, K]
    return Q8Weight(q, d)


def read_gguf_q8_head(gguf: Path) -> Q8Weight | None:
    """The GGUF's output weight (its own, else the tied token embedding) where it is Q8_0; None otherwise."""
    from gguf import GGUFReader  # imported here: only an import needs it

    tensors = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if head is None or head.tensor_type.name != "Q8_0":
        return None
    return decode_q8_blocks(np.asarray(head.data))


def unpermute_rows(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row order of a q / k projection (rows of each head: pairs -> halves)."""
    half = t.shape[0] // num_heads // 2
    return t.reshape(num_heads, half, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def read_gguf_int4(gguf: Path, num_heads: int, num_kv_heads: int) -> dict[str, Int4Weight]:
    """The GGUF's Q4_0 / Q4_1 linear weights by HF checkpoint name (without `.weight`)."""
    from gguf import GGUFReader  # imported here: only an import needs it

    weights: dict[str, Int4Weight] = {}
    for tensor in GGUFReader(str(gguf)).tensors:
        match = _BLOCK_NAME.fullmatch(tensor.name)
        kind = tensor.tensor_type.name
        if match is None or match.group(2) not in _GGUF_NAMES or kind not in ("Q4_0", "Q4_1"):
            continue
        w = decode_q4_blocks(np.asarray(tensor.data), kind)
        role = match.group(2)
        if role in ("attn_q", "attn_k"):
            heads = num_heads if role == "attn_q" else num_kv_heads
            w = Int4Weight(*(unpermute_rows(t, heads) for t in (w.codes, w.scales, w.zeros)))
        weights[f"model.layers.{match.group(1)}.{_GGUF_NAMES[role]}"] = w
    return weights


def import_gguf_int4(gguf: Path, folder: Path, num_heads: int, num_kv_heads: int) -> int:
    """Write the cache file of `gguf`'s 4-bit linears into `folder`, and of its Q8_0 LM head where it has one;
    returns how many linears (0: none, no file)."""
    weights = read_gguf_int4(gguf, num_heads, num_kv_heads)
    if weights:
        save_int4_cache(folder, weights, source=gguf.name)
        head = read_gguf_q8_head(gguf)
        if head is not None:
            save_q8_head(folder, head, source=gguf.name)
    return len(weights)


HEAD_CACHE_NAME = "quantized_head_q8_0.safetensors"


def save_q8_head(folder: Path, head: Q8Weight, source: str) -> None:
    """Write `head` as `folder`'s Q8_0 LM head cache, atomically."""
    tmp = folder / f".{HEAD_CACHE_NAME}.partial"
    save_file({"lm_head.codes": head.codes.contiguous(), "lm_head.scales": head.scales.contiguous()}, str(tmp),
              metadata={"method": "q8_0", "group_size": str(GGUF_BLOCK), "source": source})
    tmp.chmod(0o644)
    tmp.replace(folder / HEAD_CACHE_NAME)
    log.info("cached the q8_0 LM head", file=HEAD_CACHE_NAME, source=source, shape=list(head.codes.shape))


def has_q8_head(folder: Path) -> bool:
    return (folder / HEAD_CACHE_NAME).is_file()


def load_q8_head(folder: Path) -> Q8Weight | None:
    """`folder`'s cached Q8_0 LM head, or None where it has none (a folder pulled before it was kept)."""
    path = folder / HEAD_CACHE_NAME
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        if set(f.keys()) != {"lm_head.codes", "lm_head.scales"}:
            raise CheckpointError(f"{path} is not a q8_0 LM head cache (pull the model again to make it)")
        return Q8Weight(f.get_tensor("lm_head.codes"), f.get_tensor("lm_head.scales"))


def save_int4_cache(folder: Path, weights: dict[str, Int4Weight], source: str) -> None:
    """Write `weights` (by HF checkpoint name, without `.weight`) as `folder`'s int4 cache, atomically."""
    tensors = {f"{name}.{part}": getattr(w, part).contiguous() for name, w in weights.items() for part in _PARTS}
    group_sizes = {w.group_size for w in weights.values()}
    if group_sizes != {GGUF_BLOCK}:
        raise CheckpointError(f"the int4 cache holds groups of {GGUF_BLOCK} only, got {sorted(group_sizes)}")
    tmp = folder / f".{CACHE_NAME}.partial"
    save_file(tensors, str(tmp), metadata={"method": "int4", "group_size": str(GGUF_BLOCK), "source": source})
    tmp.chmod(0o644)  # safetensors writes owner-only, like the float folder's weights before their chmod
    tmp.replace(folder / CACHE_NAME)
    log.info("cached int4 weights", file=CACHE_NAME, source=source, num_linears=len(weights))


def has_int4_cache(folder: Path) -> bool:
    return (folder / CACHE_NAME).is_file()


def load_int4_cache(folder: Path) -> dict[str, Int4Weight]:
    """The cached int4 weights of `folder` by HF checkpoint name (without `.weight`)."""
    path = folder / CACHE_NAME
    if not path.is_file():
        raise CheckpointError(f"{folder} has no {CACHE_NAME} (pull the model again to make it)")
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        names = sorted({key.rsplit(".", 1)[0] for key in keys})
        missing = [f"{n}.{part}" for n in names for part in _PARTS if f"{n}.{part}" not in keys]
        if missing:
            raise CheckpointError(f"{path} is incomplete, it lacks {', '.join(missing[:5])}")
        return {n: Int4Weight(*(f.get_tensor(f"{n}.{part}") for part in _PARTS)) for n in names}
