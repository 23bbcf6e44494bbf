"""The CPU int4 GEMM for bfloat16 activations (ssd_kernels/cpu/int4_bf16_gemm, AVX512-BF16): against its plain-torch
reference, batch and thread invariance (a verify row gets a decode step's bits), the layout, a planted layout bug,
and the errors. Skipped where the CPU has no AVX512-BF16."""

import pytest
import torch

from ssd_kernels.cpu import extension as own_ext
from ssd_kernels.cpu import int4_bf16_gemm as kernel
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"bf16-avx512": own_ext.BF16_AVX512}
# Relative to max |reference|: the output's bfloat16 rounding, and the codes read as 128 + q (the bias removed
# through the group sums of x, in float32).
TOLERANCE = 1e-2


def _operands(rows: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor]:
    """x [rows, K] bfloat16, q [N, K] 0..15, d / m [N, K / 32] exact in fp16 (Q4_1-like: m about -8 d)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    q = torch.randint(0, 16, (n, k), generator=g)
    d = (torch.rand(n, k // 32, generator=g) / k**0.5).half().float()
    m = (-8 * d + torch.randn(n, k // 32, generator=g) * d).half().float()
    return x, q, d, m


def test_the_layout_round_trips():
    _, q, d, m = _operands(1, 48, 96)
    q2, d2, m2 = kernel.unpack_q32_bf16(kernel.pack_q32_bf16(q, d, m))
    assert torch.equal(q2.long(), q) and torch.equal(d2, d) and torch.equal(m2, m)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("n", [16, 80, 256])  # units of 1, 5 (4 + 1) and 16 blocks
def test_the_kernel_matches_its_reference(ext, rows, n):
    require_path(ext, PATHS, "bf16-avx512")
    x, q, d, m = _operands(rows, n, 96)
    blocks = kernel.pack_q32_bf16(q, d, m)
    y = kernel.int4_bf16_gemm(ext, x, blocks)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert relative_error(y, kernel.int4_bf16_gemm_reference(x, blocks)) < TOLERANCE


def test_the_reference_is_the_dequantized_weight():
    x, q, d, m = _operands(2, 32, 64, seed=1)
    w = (q.view(32, 2, 32).float() * d[..., None] + m[..., None]).view(32, 64)
    expected = torch.nn.functional.linear(x.float(), w).bfloat16()
    assert torch.equal(kernel.int4_bf16_gemm_reference(x, kernel.pack_q32_bf16(q, d, m)), expected)


@pytest.mark.parametrize("rows", [3, 7, 13])  # passes of 3 rows (2 blocks at once), 7 (one block), 8 + 5
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, rows):
    require_path(ext, PATHS, "bf16-avx512")
    x, q, d, m = _operands(rows, 320, 128, seed=2)
    blocks = kernel.pack_q32_bf16(q, d, m)
    assert_rows_invariant(lambda rows: kernel.int4_bf16_gemm(ext, rows, blocks), x)


def test_a_planted_layout_bug_is_caught(ext):
    """Codes whose chunks are read in the wrong order (inputs 2c.. taken for 2c + 2..) fail the comparison."""
    require_path(ext, PATHS, "bf16-avx512")
    x, q, d, m = _operands(2, 32, 64, seed=3)
    blocks = kernel.pack_q32_bf16(q, d, m)
    wrong = blocks.clone()
    wrong[..., :256] = blocks[..., :256].view(2, 2, 4, 64).roll(1, dims=2).reshape(2, 2, 256)
    assert relative_error(kernel.int4_bf16_gemm(ext, x, wrong), kernel.int4_bf16_gemm_reference(x, blocks)) > 0.1


def test_mismatched_operands_are_rejected(ext):
    _, q, d, m = _operands(1, 32, 64)
    blocks = kernel.pack_q32_bf16(q, d, m)
    with pytest.raises(ValueError, match="do not match"):
        kernel.int4_bf16_gemm(ext, torch.randn(1, 96).bfloat16(), blocks)
    with pytest.raises(ValueError, match="multiple of 16"):
        kernel.pack_q32_bf16(q[:24], d[:24], m[:24])
    if own_ext.BF16_AVX512 in own_ext.supported_paths(ext):
        with pytest.raises(RuntimeError, match="bfloat16 x"):
            ext.int4_bf16_gemm(torch.randn(1, 64), blocks)
