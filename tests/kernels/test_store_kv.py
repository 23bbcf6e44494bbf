"""The Triton KV store against its torch reference and the engine's store_kv."""

import pytest
import torch

pytest.importorskip("triton")

from ssd.layers.attention import store_kv as engine_store_kv  # noqa: E402
from ssd_kernels.store_kv import store_kv, store_kv_reference  # noqa: E402
from tests.kernels.tolerances import assert_rounded_like  # noqa: E402


def _inputs(device, dtype, cache_dtype, num_tokens=7, kv_heads=3, head_dim=24, num_slots=64):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    cache = torch.randn(2, kv_heads, num_slots, head_dim, generator=gen).to(cache_dtype)
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    return k.to(device), v.to(device), cache.to(device), slots.to(device)


DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
               (torch.float16, torch.float16), (torch.float32, torch.bfloat16)]  # (k and v, cache)


@pytest.mark.parametrize(("dtype", "cache_dtype"), DTYPE_PAIRS)
def test_store_matches_the_reference_and_the_engine(device, dtype, cache_dtype):
    k, v, cache, slots = _inputs(device, dtype, cache_dtype)
    expected, engine = cache.clone(), cache.clone()
    store_kv(k, v, cache, slots)
    store_kv_reference(k, v, expected, slots)
    engine_store_kv(k, v, engine, slots)
    assert torch.equal(expected, engine)
    assert_rounded_like(cache, expected)


def test_negative_slots_are_skipped(device):
    k, v, cache, slots = _inputs(device, torch.float32, torch.float32)
    slots[2] = -1
    expected = cache.clone()
    store_kv(k, v, cache, slots)
    store_kv_reference(k, v, expected, slots)
    assert torch.equal(cache, expected)


def test_the_launcher_rejects_bad_inputs(device):
    k, v, cache, slots = _inputs(device, torch.float32, torch.float32)
    with pytest.raises(ValueError, match="slot_mapping must have dtype"):
        store_kv(k, v, cache, slots.int())
    with pytest.raises(ValueError, match="kv_cache must be"):
        store_kv(k, v, cache[:, :2], slots)
    with pytest.raises(ValueError, match="v must be"):
        store_kv(k, v[:3], cache, slots)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        store_kv(k.transpose(1, 2).contiguous().transpose(1, 2), v, cache, slots)
