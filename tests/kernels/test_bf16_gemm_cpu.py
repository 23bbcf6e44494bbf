"""The CPU bfloat16 GEMM (ssd_kernels/cpu/bf16_gemm, AVX512-BF16): against its plain-torch reference, batch and thread
invariance (a verify row gets a decode step's bits), the layout, a planted layout bug, and the errors. Skipped
where the CPU has no AVX512-BF16."""

import pytest
import torch

from ssd_kernels.cpu import bf16_gemm
from ssd_kernels.cpu import extension as own_ext
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"bf16-avx512": own_ext.BF16_AVX512}
# Relative to max |reference|: the output's bfloat16 rounding, and each pair's two products summed in float32
# before they join the sum.
TOLERANCE = 1e-2


def _operands(rows: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) / k**0.5).bfloat16()


def test_the_layout_round_trips():
    _, w = _operands(1, 48, 10)
    assert torch.equal(bf16_gemm.unpack_bf16(bf16_gemm.pack_bf16(w)), w)


@pytest.mark.parametrize("rows", [1, 3, 5, 16, 33])
@pytest.mark.parametrize("n", [16, 80, 256])  # units of 1, 5 (4 + 1) and 16 blocks
def test_the_kernel_matches_its_reference(ext, rows, n):
    require_path(ext, PATHS, "bf16-avx512")
    x, w = _operands(rows, n, 96)
    blocks = bf16_gemm.pack_bf16(w)
    y = bf16_gemm.bf16_gemm(ext, x, blocks)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert relative_error(y, bf16_gemm.bf16_gemm_reference(x, blocks)) < TOLERANCE


def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext):
    require_path(ext, PATHS, "bf16-avx512")
    x, w = _operands(7, 320, 128, seed=2)
    blocks = bf16_gemm.pack_bf16(w)
    assert_rows_invariant(lambda rows: bf16_gemm.bf16_gemm(ext, rows, blocks), x)


def test_a_planted_layout_bug_is_caught(ext):
    """Blocks whose pairs are laid out input-feature-major (16 features' first weights, then their second ones)
    fail the comparison."""
    require_path(ext, PATHS, "bf16-avx512")
    x, w = _operands(2, 32, 64, seed=3)
    blocks = bf16_gemm.pack_bf16(w)
    wrong = blocks.view(2, 32, 16, 2).transpose(2, 3).reshape(2, 32, 32).contiguous()
    assert relative_error(bf16_gemm.bf16_gemm(ext, x, wrong), bf16_gemm.bf16_gemm_reference(x, blocks)) > 0.1


def test_mismatched_operands_are_rejected(ext):
    x, w = _operands(1, 32, 64)
    with pytest.raises(ValueError, match="do not match"):
        bf16_gemm.bf16_gemm(ext, torch.randn(1, 96).bfloat16(), bf16_gemm.pack_bf16(w))
    with pytest.raises(ValueError, match="multiple of 16"):
        bf16_gemm.pack_bf16(w[:24])
    with pytest.raises(ValueError, match="bfloat16 weights"):
        bf16_gemm.pack_bf16(w.float())
