"""A GGUF's own 4-bit linear weights (Q4_0 / Q4_1), repacked once into the portable int4 form and cached.

`import_gguf_int4` reads the GGUF's blocks without dequantizing them, undoes llama.cpp's q/k row order, names
each tensor as the HF checkpoint does, and writes `quantized_int4.safetensors` into the model folder
(codes, scales, zeros per linear; see ssd/layers/quantized_linear.py). Tensors of other GGUF types (Q8_0
embeddings, float norms) stay in the float folder: the per-channel int8 kernel cannot hold Q8_0's
per-block scales exactly. The device's kernel layout is made from the cache at load (CPU and CUDA differ).
"""

import re
from pathlib import Path

import numpy as np
import structlog
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ssd.errors import CheckpointError
from ssd.layers.quantized_linear import Int4Weight, pack_int4_codes

log = structlog.get_logger(__name__)

CACHE_NAME = "quantized_int4.safetensors"
GGUF_BLOCK = 32  # Q4_0 / Q4_1 quantize 32 input features per block
_GGUF_NAMES = {  # blk.{i}.<gguf> -> model.layers.{i}.<hf>
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
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
    """Write the cache file of `gguf`'s 4-bit linears into `folder`; returns how many (0: none, no file)."""
    weights = read_gguf_int4(gguf, num_heads, num_kv_heads)
    if not weights:
        return 0
    tensors = {}
    for name, w in weights.items():
        tensors |= {f"{name}.codes": w.codes, f"{name}.scales": w.scales, f"{name}.zeros": w.zeros}
    tmp = folder / f".{CACHE_NAME}.partial"
    save_file(tensors, str(tmp), metadata={"method": "int4", "group_size": str(GGUF_BLOCK), "source": gguf.name})
    tmp.replace(folder / CACHE_NAME)
    log.info("cached the gguf's int4 weights", file=CACHE_NAME, num_linears=len(weights))
    return len(weights)


def has_int4_cache(folder: Path) -> bool:
    return (folder / CACHE_NAME).is_file()


def load_int4_cache(folder: Path) -> dict[str, Int4Weight]:
    """The cached int4 weights of `folder` by HF checkpoint name (without `.weight`)."""
    path = folder / CACHE_NAME
    if not path.is_file():
        raise CheckpointError(f"{folder} has no {CACHE_NAME} (pull the model again to make it)")
    with safe_open(str(path), framework="pt") as f:
        names = {key.rsplit(".", 1)[0] for key in f.keys()}  # noqa: SIM118 - safe_open is not a mapping
        try:
            return {n: Int4Weight(f.get_tensor(f"{n}.codes"), f.get_tensor(f"{n}.scales"),
                                  f.get_tensor(f"{n}.zeros")) for n in sorted(names)}
        except KeyError as e:  # safetensors raises its own error type; a missing part reads as this
            raise CheckpointError(f"{path} is incomplete: {e}") from e
