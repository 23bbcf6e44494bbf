"""The CPU float32 GEMM (ssd_kernels/cpu/dense_gemm): each path this CPU runs against its plain-torch reference,
batch and thread invariance (a verify row gets a decode step's bits), a planted bug, and the errors. A path the
CPU lacks is skipped."""

import pytest
import torch

from ssd_kernels.cpu import dense_gemm
from ssd_kernels.cpu import extension as own_ext
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"float-avx2": own_ext.FLOAT_AVX2, "float-avx512": own_ext.FLOAT_AVX512}
TOLERANCE = 1e-5  # relative to max |reference|: the same products summed in another order


def _operands(rows: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g) / k**0.5


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 5, 16])
def test_each_path_matches_its_reference(ext, name, rows):
    path = require_path(ext, PATHS, name)
    x, w = _operands(rows, 68, 96)  # N not a multiple of 16, K: 3 steps of 32
    y = dense_gemm.dense_gemm(ext, x, w, path)
    assert y.dtype == torch.float32 and y.shape == (rows, 68)
    assert relative_error(y, dense_gemm.dense_gemm_reference(x, w)) < TOLERANCE


@pytest.mark.parametrize("name", PATHS)
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, name):
    path = require_path(ext, PATHS, name)
    x, w = _operands(7, 256, 128, seed=2)
    assert_rows_invariant(lambda rows: dense_gemm.dense_gemm(ext, rows, w, path), x)


def test_a_planted_bug_is_caught(ext):
    """Reading the weight's rows in the wrong order (2 and 3 of each tile swapped) fails the comparison."""
    x, w = _operands(2, 16, 64, seed=3)
    order = torch.tensor([0, 1, 3, 2]).repeat(4) + torch.arange(16) // 4 * 4
    path = own_ext.supported_paths(ext)[0]
    assert relative_error(dense_gemm.dense_gemm(ext, x, w[order].contiguous(), path),
                          dense_gemm.dense_gemm_reference(x, w)) > 0.1


def test_mismatched_operands_are_rejected(ext):
    x, w = _operands(1, 8, 64)
    with pytest.raises(ValueError, match="do not match"):
        dense_gemm.dense_gemm(ext, torch.randn(1, 96), w, own_ext.FLOAT_AVX2)
    with pytest.raises(ValueError, match="N of 4"):
        dense_gemm.dense_gemm(ext, x, w[:6], own_ext.FLOAT_AVX2)
    with pytest.raises(RuntimeError, match="float32 x and weight"):
        dense_gemm.dense_gemm(ext, x.bfloat16(), w, own_ext.FLOAT_AVX2)
