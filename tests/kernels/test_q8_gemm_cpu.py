"""The CPU Q8_0 GEMM (ssd_kernels/cpu/q8_gemm): each float path this CPU runs against its plain-torch reference,
batch and thread invariance, the weight layout, and a planted layout bug. The extension is built once per session
(cached under the project's cache folder, like the engine's own build); a path the CPU lacks is skipped."""

import pytest
import torch

from ssd_kernels.cpu import extension as own_ext
from ssd_kernels.cpu import q8_gemm
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"float-avx2": own_ext.FLOAT_AVX2, "float-avx512": own_ext.FLOAT_AVX512}
# Relative to max |reference|. float32: the same products (q * d is exact), summed in another order.
# bfloat16: the output's rounding.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}



def _weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] int8, d [N, K / 32] fp16-exact, like a GGUF Q8_0 tensor."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-4).half().float()
    return q, d




def test_the_layout_round_trips_and_dequantizes_exactly():
    q, d = _weight(8, 96)
    blocks = q8_gemm.pack_q8(q, d)
    q2, d2 = q8_gemm.unpack_q8(blocks)
    assert torch.equal(q2, q) and torch.equal(d2, d)
    assert torch.equal(q8_gemm.dequantize(blocks), (q.view(8, 3, 32).float() * d[..., None]).view(8, 96))


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 5, 16])
def test_each_path_matches_its_reference(ext, name, dtype, rows):
    path = require_path(ext, PATHS, name)
    blocks = q8_gemm.pack_q8(*_weight(68, 96))  # N not a multiple of 16, K: 3 groups
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = q8_gemm.q8_gemm(ext, x, blocks, path)
    assert y.dtype == dtype and y.shape == (rows, 68)
    assert relative_error(y, q8_gemm.q8_gemm_reference(x, blocks)) < TOLERANCE[dtype]


@pytest.mark.parametrize("name", PATHS)
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, name):
    path = require_path(ext, PATHS, name)
    blocks = q8_gemm.pack_q8(*_weight(256, 128))
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2))
    assert_rows_invariant(lambda rows: q8_gemm.q8_gemm(ext, rows, blocks, path), x)


def test_a_planted_tile_order_bug_is_caught(ext):
    """Packing the features of a tile in the wrong order (2 and 3 swapped) fails the comparison."""
    q, d = _weight(16, 64)
    blocks = q8_gemm.pack_q8(q, d)
    order = torch.tensor([0, 1, 3, 2]).repeat(4) + torch.arange(16) // 4 * 4
    swapped = q8_gemm.pack_q8(q[order], d)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    path = own_ext.supported_paths(ext)[0]
    assert relative_error(q8_gemm.q8_gemm(ext, x, swapped, path), q8_gemm.q8_gemm_reference(x, blocks)) > 0.1


def test_mismatched_shapes_are_rejected(ext):
    blocks = q8_gemm.pack_q8(*_weight(8, 64))
    with pytest.raises(ValueError, match="do not match"):
        q8_gemm.q8_gemm(ext, torch.randn(1, 96), blocks, own_ext.FLOAT_AVX2)
    with pytest.raises(ValueError, match="multiple of 4"):
        q8_gemm.pack_q8(*_weight(6, 64))
