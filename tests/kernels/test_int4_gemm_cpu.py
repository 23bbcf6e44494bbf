"""The CPU int4 GEMM (ssd_kernels/cpu/int4_gemm): each path this CPU runs against its plain-torch reference, batch and
thread invariance, the weight layout, and a planted layout bug. The extension is built once per session (cached
under the project's cache folder, like the engine's own build); a path the CPU lacks is skipped."""

import pytest
import torch

from ssd_kernels.cpu import extension as own_ext
from ssd_kernels.cpu import int4_gemm as own
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"float-avx2": own_ext.FLOAT_AVX2, "float-avx512": own_ext.FLOAT_AVX512, "vnni-avx512": own_ext.VNNI_AVX512}
# Relative to max |reference|. float32: the same products, summed in another order. bfloat16: the output's rounding.
# VNNI against the float reference: its int8 activations (7 bits of each group's largest value).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
VNNI_VS_FLOAT = 3e-2



def _weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, K] 0..15, d and m [N, K / 32], fp16-exact, like a GGUF Q4_1 tensor."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = (-8 * d + torch.randn(n, k // 32, generator=g) * 1e-3).half().float()
    return q, d, m




def test_the_layout_round_trips():
    q, d, m = _weight(8, 128)
    q2, d2, m2 = own.unpack_q32(*own.pack_q32(q, d, m))
    assert torch.equal(q2, q.to(torch.uint8)) and torch.equal(d2, d) and torch.equal(m2, m)


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 5, 16])
def test_each_path_matches_its_reference(ext, name, dtype, rows):
    path = require_path(ext, PATHS, name)
    blocks, mins = own.pack_q32(*_weight(68, 192))  # N not a multiple of 16, K: 3 pairs of groups
    x = torch.randn(rows, 192, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = own.int4_gemm(ext, x, blocks, mins, path)
    assert y.dtype == dtype and y.shape == (rows, 68)
    assert relative_error(y, own.int4_gemm_reference(x, blocks, mins, path)) < TOLERANCE[dtype]
    if path == own_ext.VNNI_AVX512:
        assert relative_error(y, own.int4_gemm_reference(x, blocks, mins)) < VNNI_VS_FLOAT


@pytest.mark.parametrize("name", PATHS)
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, name):
    path = require_path(ext, PATHS, name)
    blocks, mins = own.pack_q32(*_weight(256, 128))
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert_rows_invariant(lambda rows: own.int4_gemm(ext, rows, blocks, mins, path), x)


def test_a_planted_nibble_order_bug_is_caught(ext):
    """Packing q[j] in the high nibble (the portable order) instead of the low one fails the comparison."""
    q, d, m = _weight(16, 64)
    blocks, mins = own.pack_q32(q, d, m)
    halves = q.view(16, 2, 2, 16)
    swapped, _ = own.pack_q32(torch.stack([halves[:, :, 1], halves[:, :, 0]], 2).view(16, 64), d, m)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    path = [p for p in own_ext.supported_paths(ext) if p in PATHS.values()][-1]  # int4's widest path here
    assert relative_error(own.int4_gemm(ext, x, swapped, mins, path), own.int4_gemm_reference(x, blocks, mins)) > 0.1


def test_mismatched_shapes_are_rejected(ext):
    blocks, mins = own.pack_q32(*_weight(8, 64))
    with pytest.raises(ValueError, match="do not match"):
        own.int4_gemm(ext, torch.randn(1, 128), blocks, mins, own_ext.FLOAT_AVX2)
    with pytest.raises(ValueError, match="multiple of 4"):
        own.pack_q32(*_weight(6, 64))
