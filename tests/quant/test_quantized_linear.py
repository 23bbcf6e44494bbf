"""The int4 / int8 kernels against their dequantizing references, and the GGUF block decoding against gguf-py."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from ssd.layers.quantized_linear import Int4Kernel, Int4Matmul, Int8Matmul
from ssd.quantized_weights import Int4Weight, decode_q4_blocks, quantize_int4, quantize_int8, unpermute_rows

CPU = torch.device("cpu")
# float32: the kernels and the references sum the same products; bfloat16 rounds the activations' partial sums
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("rows", [1, 5])
def test_int4_kernel_matches_reference(dtype, group_size, rows):
    torch.manual_seed(0)
    matmul = Int4Matmul(quantize_int4(torch.randn(96, 128), group_size), dtype, CPU)
    assert matmul.packed is not None  # the kernel runs, not the reference twice
    x = torch.randn(rows, 128).to(dtype)
    assert relative_error(matmul.kernel(x), matmul.reference(x)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
def test_int8_kernel_matches_reference(dtype, rows):
    torch.manual_seed(0)
    matmul = Int8Matmul(quantize_int8(torch.randn(96, 128)), dtype, CPU)
    assert matmul.has_kernel
    x = torch.randn(rows, 128).to(dtype)
    assert relative_error(matmul.kernel(x), matmul.reference(x)) < TOLERANCE[dtype]


def test_quantizers_round_trip_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    int4 = quantize_int4(w, 32)
    step = int4.scales.repeat_interleave(32, 1)  # [N, K]
    assert ((int4.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    int8 = quantize_int8(w)
    assert ((int8.dequantize() - w).abs() <= int8.scales[:, None] / 2 + 1e-6).all()


def test_a_planted_convention_bug_is_caught():
    """Reading the int4 zero point as q * scale + zero (not (q - 8) * scale + zero) fails the comparison."""
    torch.manual_seed(0)
    weight = quantize_int4(torch.randn(64, 64), 32)
    x = torch.randn(3, 64)
    wrong = weight.unpacked().float() * weight.scales.repeat_interleave(32, 1) + weight.zeros.repeat_interleave(32, 1)
    assert relative_error(x @ wrong.T, Int4Matmul(weight, torch.float32, CPU).kernel(x)) > 0.1


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_blocks_decode_to_gguf_py_values(kind):
    """Our (scale, zero) mapping of Q4_0 / Q4_1 gives exactly the values gguf-py dequantizes to."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 128)).astype(np.float32)
    qtype = GGMLQuantizationType[kind]
    raw = quantize(w, qtype)  # [16, blocks * bytes] uint8
    expected = torch.from_numpy(dequantize(raw, qtype).astype(np.float32))
    decoded = decode_q4_blocks(raw, kind)
    assert decoded.group_size == 32
    torch.testing.assert_close(decoded.dequantize(), expected, rtol=0, atol=1e-6)


def test_unpermute_rows_inverts_llama_cpp_order():
    heads, head_dim = 3, 8
    w = torch.arange(heads * head_dim * 4, dtype=torch.float32).reshape(heads * head_dim, 4)
    # llama.cpp's converter: rows of each head, halves -> interleaved pairs
    permuted = w.reshape(heads, 2, head_dim // 2, 4).transpose(1, 2).reshape(w.shape)
    torch.testing.assert_close(unpermute_rows(permuted, heads), w)


def test_a_gguf_file_imports_to_hf_names_and_row_order(tmp_path):
    """A tiny GGUF (llama.cpp's q/k row order, Q4_1 and Q4_0 blocks, a float norm): the int4 cache holds the
    HF-named, HF-ordered weights, and the float tensors are left out."""
    import gguf

    from ssd.quantized_weights import import_gguf_int4, load_int4_cache

    heads, kv_heads, head_dim, hidden = 2, 1, 8, 64
    rng = np.random.default_rng(0)
    hf = {"attn_q": rng.standard_normal((heads * head_dim, hidden)), "attn_k": rng.standard_normal((head_dim, hidden)),
          "ffn_down": rng.standard_normal((hidden, 64))}
    kinds = {"attn_q": "Q4_1", "attn_k": "Q4_1", "ffn_down": "Q4_0"}

    def permute(w: np.ndarray, n: int) -> np.ndarray:  # llama.cpp's converter: halves -> interleaved pairs
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(tmp_path / "tiny.gguf", "llama")
    expected = {}
    for role, w in hf.items():
        stored = permute(w, heads if role == "attn_q" else kv_heads) if role != "ffn_down" else w
        qtype = GGMLQuantizationType[kinds[role]]
        raw = quantize(stored.astype(np.float32), qtype)
        writer.add_tensor(f"blk.0.{role}.weight", raw, raw_shape=raw.shape, raw_dtype=qtype)
        values = torch.from_numpy(dequantize(raw, qtype).astype(np.float32))
        expected[role] = values if role == "ffn_down" else unpermute_rows(values, heads if role == "attn_q" else kv_heads)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    assert import_gguf_int4(tmp_path / "tiny.gguf", tmp_path, heads, kv_heads) == 3
    cache = load_int4_cache(tmp_path)
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "ffn_down": "mlp.down_proj"}
    assert sorted(cache) == sorted(f"model.layers.0.{n}" for n in names.values())
    for role, name in names.items():
        got = cache[f"model.layers.0.{name}"].dequantize()
        torch.testing.assert_close(got, expected[role], rtol=0, atol=1e-6)
        assert (got - torch.from_numpy(hf[role]).float()).abs().max() < 0.5  # the HF row order, not llama.cpp's


def _cpu_has_bf16_kernels() -> bool:
    from ssd.layers import cpu_kernels
    from ssd_kernels.cpu import extension as own_ext

    ext = cpu_kernels.extension()
    return ext is not None and own_ext.BF16_AVX512 in own_ext.supported_paths(ext)


def _fp16_exact_int4(n: int, k: int) -> Int4Weight:
    """A group-32 weight whose scales and mins are fp16 values, like the GGUF's Q4_1 blocks."""
    w = quantize_int4(torch.randn(n, k), 32)
    d = w.scales.half().float()
    return Int4Weight(w.codes, d, (w.zeros - 8 * w.scales).half().float() + 8 * d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("choice", [Int4Kernel.AUTO, Int4Kernel.OWN, Int4Kernel.OWN_INT8, Int4Kernel.TORCH])
@pytest.mark.parametrize("rows", [1, 5])
def test_gguf_like_int4_on_each_kernel_choice_matches_the_reference(dtype, choice, rows):
    """The own kernel holds the weight exactly: float32 within float32 rounding; bfloat16 within the bf16 output's
    rounding, OWN_INT8 within its int8 activations' too (the reference itself reads bf16 scales)."""
    torch.manual_seed(0)
    matmul = Int4Matmul(_fp16_exact_int4(96, 128), dtype, CPU)
    assert matmul.has_own_kernel and matmul.packed is not None
    matmul.kernel_choice = choice
    has_bf16_kernel = _cpu_has_bf16_kernels()
    assert (matmul.own_bf16_blocks is not None) == (dtype == torch.bfloat16 and has_bf16_kernel)
    auto_own = dtype == torch.float32 or has_bf16_kernel  # AUTO: bfloat16 runs own where its bfloat16 kernel runs
    own = choice in (Int4Kernel.OWN, Int4Kernel.OWN_INT8) or (choice == Int4Kernel.AUTO and auto_own)
    assert matmul.runs_own_kernel(dtype) == own
    x = torch.randn(rows, 128).to(dtype)
    tolerance = 5e-2 if choice == Int4Kernel.OWN_INT8 and dtype == torch.bfloat16 else TOLERANCE[dtype]
    assert relative_error(matmul(x), matmul.reference(x)) < tolerance


@pytest.mark.parametrize("batch", [None, 1, 2, 3, 16])
def test_the_bfloat16_int4_kernel_takes_amx_tiles_for_batches_of_three_or_more(batch):
    """Where the CPU has AMX-BF16, a bfloat16 int4 weight loaded for an engine of 3 or more sequences a step (or an
    unknown batch) runs the kernel's tiles, for 1 or 2 the AVX512-BF16 loop (faster at one row); both match the
    reference. A weight whose tiles would not hold w = q d + m in one rounding keeps the loop."""
    from ssd.layers import cpu_kernels
    from ssd_kernels.cpu import extension as own_ext

    if not _cpu_has_bf16_kernels():
        pytest.skip("this CPU has no AVX512-BF16")
    amx = own_ext.AMX_BF16 in own_ext.supported_paths(cpu_kernels.extension())
    torch.manual_seed(0)
    weight = _fp16_exact_int4(96, 128)
    scales, zeros = weight.scales.clone(), weight.zeros.clone()
    scales[0, 0], zeros[0, 0] = 1.0, 8 + 2**-20  # d = 1, m = 2^-20: m - 128 d needs 28 bits, more than float32's 24
    inexact = Int4Weight(weight.codes, scales, zeros)
    with cpu_kernels.decode_batch(batch):
        matmul = Int4Matmul(weight, torch.bfloat16, CPU)
        inexact_matmul = Int4Matmul(inexact, torch.bfloat16, CPU)
    tiles = amx and (batch is None or batch >= cpu_kernels.TILES_FROM_SEQUENCES)
    assert matmul.own_bf16_path == (own_ext.AMX_BF16 if tiles else own_ext.BF16_AVX512)
    assert inexact_matmul.own_bf16_blocks is not None and inexact_matmul.own_bf16_path == own_ext.BF16_AVX512
    x = torch.randn(5, 128).bfloat16()
    assert relative_error(matmul(x), matmul.reference(x)) < TOLERANCE[torch.bfloat16]


def test_int4_quantized_at_load_runs_the_own_kernel():
    """quantize_int4 keeps each group's scale and minimum in fp16, as GGUF Q4_1 does, so the own kernel holds the
    weight exactly; scales that are not fp16 values keep torch's kernel."""
    weight = quantize_int4(torch.randn(96, 128), 32)
    matmul = Int4Matmul(weight, torch.bfloat16, CPU)
    assert matmul.has_own_kernel and matmul.packed is not None
    x, fp32 = torch.randn(3, 128), Int4Matmul(weight, torch.float32, CPU)
    assert fp32.runs_own_kernel(torch.float32) and relative_error(fp32(x), fp32.reference(x)) < TOLERANCE[torch.float32]
    off_fp16 = Int4Weight(weight.codes, weight.scales * (1 + 2**-14), weight.zeros)
    assert not Int4Matmul(off_fp16, torch.bfloat16, CPU).has_own_kernel


def test_a_failed_build_falls_back_to_torchs_kernel_with_one_warning(monkeypatch):
    from structlog.testing import capture_logs

    from ssd.layers import cpu_kernels
    from ssd_kernels.cpu import extension as own_ext

    def no_compiler(build_root):  # noqa: ANN001, ANN202
        raise own_ext.KernelBuildError("no compiler here")

    cpu_kernels.extension.cache_clear()
    monkeypatch.setattr(own_ext, "load_extension", no_compiler)
    try:
        with capture_logs() as logs:
            matmuls = [Int4Matmul(_fp16_exact_int4(96, 128), torch.bfloat16, CPU) for _ in range(2)]
        assert all(not m.has_own_kernel and m.packed is not None for m in matmuls)
        assert [e["log_level"] for e in logs if "own CPU kernels" in e["event"]] == ["warning"]
    finally:
        cpu_kernels.extension.cache_clear()  # the next user loads the real (cached) build again


def test_the_bfloat16_kernel_serves_a_prefill_with_a_decode_steps_bits():
    """Where the bfloat16 kernel runs, it serves any number of rows: a 40-row prefill matches the reference, and each
    of its rows has the bits that row gets alone (so a prefill's keys are a decode step's)."""
    if not _cpu_has_bf16_kernels():
        pytest.skip("this CPU has no AVX512-BF16")
    torch.manual_seed(0)
    matmul = Int4Matmul(_fp16_exact_int4(96, 128), torch.bfloat16, CPU)
    x = torch.randn(40, 128).bfloat16()
    y = matmul(x)
    assert relative_error(y, matmul.reference(x)) < TOLERANCE[torch.bfloat16]
    assert torch.equal(y, torch.cat([matmul(x[i : i + 1]) for i in range(40)]))


def test_the_int4_kernels_a_model_runs_are_named_for_the_ready_log():
    from ssd.layers import cpu_kernels
    from ssd.layers.quantized_linear import int4_kernels
    from ssd_kernels.cpu import extension as own_ext

    torch.manual_seed(0)
    with cpu_kernels.decode_batch(16):
        model = torch.nn.Sequential(Int4Matmul(_fp16_exact_int4(32, 64), torch.bfloat16, CPU))
    torch_kernel = "reference" if model[0].packed is None else "torch int4pack"
    expected = torch_kernel
    if _cpu_has_bf16_kernels():
        amx = own_ext.AMX_BF16 in own_ext.supported_paths(cpu_kernels.extension())
        expected = "own AMX tiles" if amx else "own bfloat16 loop"
    assert int4_kernels(model) == expected
    model[0].kernel_choice = Int4Kernel.TORCH
    assert int4_kernels(model) == torch_kernel
    model[0].kernel_choice = Int4Kernel.OWN_INT8
    assert int4_kernels(model) == ("own int8 activations" if model[0].has_own_kernel else torch_kernel)
    assert int4_kernels(torch.nn.Linear(4, 4)) is None
