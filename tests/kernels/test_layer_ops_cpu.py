"""The project's CPU layer ops (ssd_kernels/cpu/layer_ops.cpp) against the torch ops they replace: RMSNorm with
and without the residual, RoPE on strided rows, SiLU-and-multiply, storing K/V, and few-query paged attention
(causal, Q queries per sequence), with a query's bits independent of the batch and of Q, and a planted bug."""

import pytest
import torch

from ssd.layers import cpu_kernels
from ssd.layers.activation import SiluAndMul
from ssd.layers.attention import store_kv
from ssd.layers.norm import RMSNorm
from ssd.layers.rotary import RotaryEmbedding
from ssd.model_config import RopeConfig
from tests.kernels.attention_cases import attention_case, reference_attention

# Relative to max |torch|: float32, the same arithmetic in another order; bfloat16, the output's rounding
# (the ops round once where torch rounds after every op).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def ops():
    ext = cpu_kernels.extension()
    if ext is None:
        pytest.fail("the project's CPU kernels do not build here")
    return ext


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item() < TOLERANCE[dtype]


def _torch(fn):  # fn() on the layers' torch ops
    cpu_kernels.set_layer_ops(False)
    try:
        return fn()
    finally:
        cpu_kernels.set_layer_ops(True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_and_without_the_residual(ops, dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-5).to(dtype)
    norm.weight.data = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    x, residual = (torch.randn(5, 96, generator=g).to(dtype) for _ in range(2))
    assert _close(norm(x), _torch(lambda: norm(x)), dtype)
    (normed, summed), (ref_normed, ref_summed) = norm(x, residual), _torch(lambda: norm(x, residual))
    assert torch.equal(summed, ref_summed) and _close(normed, ref_normed, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", [RopeConfig(), RopeConfig(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                          high_freq_factor=4.0, original_max_position_embeddings=64)])
def test_rope_on_the_strided_q_and_k_of_a_fused_row(ops, dtype, rope):
    g = torch.Generator().manual_seed(1)
    layer = RotaryEmbedding(32, 256, rope)
    qkv = torch.randn(6, (3 + 1 + 1) * 32, generator=g).to(dtype)
    qk = qkv[:, : 4 * 32].view(6, 4, 32)  # rows strided by the whole fused row
    positions = torch.tensor([0, 5, 17, 100, 200, 255])
    assert _close(layer(positions, qk), _torch(lambda: layer(positions, qk)), dtype)


def test_rope_rejects_a_position_outside_its_table(ops):
    layer = RotaryEmbedding(32, 16, RopeConfig())
    with pytest.raises(RuntimeError, match="outside the table"):
        layer(torch.tensor([16]), torch.randn(1, 2, 32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(ops, dtype):
    x = torch.randn(4, 2 * 80, generator=torch.Generator().manual_seed(2)).to(dtype)
    act = SiluAndMul()
    assert _close(act(x), _torch(lambda: act(x)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_writes_what_index_copy_writes(ops, dtype):
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(4, 2 * 2 * 16, generator=g).to(dtype)  # [T, (K | V) x KVH x D], rows strided
    k, v = kv[:, :32].view(4, 2, 16), kv[:, 32:].view(4, 2, 16)
    slots = torch.tensor([7, 2, 30, 11])
    cache, expected = (torch.zeros(2, 2, 32, 16, dtype=dtype) for _ in range(2))
    store_kv(k, v, cache, slots)
    _torch(lambda: store_kv(k, v, expected, slots))
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q", [1, 5])
def test_paged_attention_matches_the_torch_path(ops, dtype, q):
    queries, cache, kv_slots, seq_lens = attention_case(dtype, [9, 40, 23], q)
    out = ops.paged_attention(queries, cache, kv_slots, seq_lens, q, 0.25)
    assert out.dtype == dtype and _close(out, reference_attention(queries, cache, kv_slots, seq_lens, q, 0.25), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "d"), [(9, 3, 64), (8, 2, 128), (4, 4, 64)])
def test_paged_attention_of_the_avx512_head_sizes_matches_the_torch_path(ops, dtype, heads, kv_heads, d):
    """D = 64 / 128 run the AVX-512 kernel where the CPU has it (scores 16 keys at a time, then a tail): 5, 16, 37
    and 200 keys against the torch path, and a query gets the same bits alone as in the batch."""
    queries, cache, kv_slots, seq_lens = attention_case(dtype, [5, 16, 37, 200], 2, heads=heads, kv_heads=kv_heads,
                                                         d=d)
    out = ops.paged_attention(queries, cache, kv_slots, seq_lens, 2, d**-0.5)
    assert _close(out, reference_attention(queries, cache, kv_slots, seq_lens, 2, d**-0.5), dtype)
    last = ops.paged_attention(queries[7:8], cache, kv_slots[3:], seq_lens[3:], 1, d**-0.5)
    assert torch.equal(out[7:8], last)


def test_a_query_gets_the_same_bits_alone_in_a_batch_in_a_verify_and_on_two_threads(ops):
    queries, cache, kv_slots, seq_lens = attention_case(torch.float32, [12, 30], 4)
    batch = ops.paged_attention(queries, cache, kv_slots, seq_lens, 4, 0.25)  # [8, H, D]
    alone = ops.paged_attention(queries[4:8], cache, kv_slots[1:], seq_lens[1:], 4, 0.25)
    as_decode = ops.paged_attention(queries[7:8], cache, kv_slots[1:], seq_lens[1:], 1, 0.25)  # the last query
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = ops.paged_attention(queries, cache, kv_slots, seq_lens, 4, 0.25)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch[4:8], alone) and torch.equal(batch[7:8], as_decode) and torch.equal(batch, two)


def test_a_planted_off_by_one_in_the_causal_bound_is_caught(ops):
    """Letting each query see one key fewer (seq_len - 1) fails the comparison with the torch path."""
    queries, cache, kv_slots, seq_lens = attention_case(torch.float32, [9, 40], 3)
    wrong = ops.paged_attention(queries, cache, kv_slots, seq_lens - 1, 3, 0.25)
    assert not _close(wrong, reference_attention(queries, cache, kv_slots, seq_lens, 3, 0.25), torch.float32)


def test_paged_attention_rejects_bad_inputs(ops):
    queries, cache, kv_slots, seq_lens = attention_case(torch.float32, [9], 2)
    with pytest.raises(RuntimeError, match="seq_len"):
        ops.paged_attention(queries, cache, kv_slots, torch.tensor([10]), 2, 0.25)  # more keys than slots given
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.paged_attention(queries, cache, kv_slots + 1000, seq_lens, 2, 0.25)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_attention_is_rope_store_and_attention_one_by_one(ops, dtype):
    """The fused call from a projection row gives the bits of the three ops called in turn, cache included."""
    g = torch.Generator().manual_seed(5)
    heads, kv_heads, d, q = 4, 2, 16, 3
    layer = RotaryEmbedding(d, 64, RopeConfig())
    seq_lens = torch.tensor([7, 12])
    _, cache, kv_slots, _ = attention_case(dtype, seq_lens.tolist(), q)
    cache = cache[:, :kv_heads].contiguous()
    qkv = torch.randn(2 * q, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    positions = torch.cat([torch.arange(n - q, n) for n in seq_lens.tolist()])
    slots = torch.cat([kv_slots[b, n - q : n] for b, n in enumerate(seq_lens.tolist())])
    fused_cache, split_cache = cache.clone(), cache.clone()
    fused = ops.rope_attention(qkv, positions, layer.cos, layer.sin, fused_cache, slots, kv_slots, seq_lens, q,
                               heads, kv_heads, 0.25)
    roped_q = ops.rope(qkv[:, : heads * d].view(-1, heads, d), positions, layer.cos, layer.sin)
    roped_k = ops.rope(qkv[:, heads * d : (heads + kv_heads) * d].view(-1, kv_heads, d), positions, layer.cos, layer.sin)
    ops.store_kv(roped_k, qkv[:, (heads + kv_heads) * d :].view(-1, kv_heads, d), split_cache, slots)
    split = ops.paged_attention(roped_q, split_cache, kv_slots, seq_lens, q, 0.25).view(2 * q, -1)
    assert torch.equal(fused, split) and torch.equal(fused_cache, split_cache)


def test_where_autograd_records_the_layers_keep_torchs_ops_and_their_gradients(ops):
    """Training a draft (grad mode, a trainable norm weight or an input that needs grad): the ops have no backward,
    so the layers run torch's; the gradients equal those of the torch path."""
    g = torch.Generator().manual_seed(6)
    norm = RMSNorm(64, 1e-5)
    norm.weight.requires_grad_(True)
    x = torch.randn(3, 2 * 64, generator=g, requires_grad=True)
    layer = RotaryEmbedding(16, 32, RopeConfig())

    def loss() -> torch.Tensor:
        hidden = SiluAndMul()(x)  # [3, 64]
        roped = layer(torch.tensor([1, 2, 3]), norm(hidden).view(3, 4, 16))
        return roped.square().sum()

    loss().backward()
    grads = (x.grad.clone(), norm.weight.grad.clone())
    x.grad, norm.weight.grad = None, None
    _torch(lambda: loss().backward())
    assert torch.equal(grads[0], x.grad) and torch.equal(grads[1], norm.weight.grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_at_the_ends_of_the_float_range(ops, dtype):
    """Gates far out in both tails, zero, and one NaN: the op's exp neither overflows into NaN nor loses the sign."""
    gate = torch.tensor([-1e4, -100.0, -88.0, -20.0, -1.0, 0.0, 1e-30, 1.0, 20.0, 88.0, 100.0, 1e4, 3.0, -3.0, 0.5,
                         float("nan")] * 2)
    x = torch.cat([gate, torch.full_like(gate, 2.0)])[None].to(dtype)  # [1, 2 x 32]
    act = SiluAndMul()
    got, expected = act(x), _torch(lambda: act(x))
    assert torch.equal(got.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert _close(got[finite], expected[finite], dtype)
