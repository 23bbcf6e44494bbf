"""The CPU int4 GEMM for bfloat16 activations (ssd_kernels/cpu/int4_bf16_gemm: AVX512-BF16, and AMX-BF16 tiles of the
dequantized weights): against its plain-torch reference, batch and thread invariance (a verify row gets a decode
step's bits), the AMX path against the bfloat16 GEMM on the dequantized weight, which weights the tiles hold exactly,
the layout, a planted layout bug, and the errors. Each path is skipped where the CPU does not run it."""

import pytest
import torch

from ssd_kernels.cpu import bf16_gemm
from ssd_kernels.cpu import extension as own_ext
from ssd_kernels.cpu import int4_bf16_gemm as kernel
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"bf16-avx512": own_ext.BF16_AVX512, "amx-bf16": own_ext.AMX_BF16}
# Relative to max |the path's reference|: the output's bfloat16 rounding, and on AVX512-BF16 the codes read as
# 128 + q (the bias removed through the group sums of x, in float32).
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


@pytest.mark.parametrize("name", PATHS)
def test_the_layout_round_trips(name):
    _, q, d, m = _operands(1, 48, 96)
    q2, d2, m2 = kernel.unpack_q32_bf16(kernel.pack_q32_bf16(q, d, m, PATHS[name]), PATHS[name])
    assert torch.equal(q2.long(), q) and torch.equal(d2, d) and torch.equal(m2, m)


def test_the_amx_layout_orders_a_chunks_words_by_row_half():
    """Word 4 (f % 8) + 2h + f / 8 of chunk c holds feature f's codes for inputs 2c + 8n + h (nibble n)."""
    q = torch.zeros(16, 32, dtype=torch.long)
    q[9, 1] = 5  # feature 9 = 8 + 1, input 1: chunk 0, nibble 0, h = 1 -> word 4 + 2 + 1 = 7
    d, m = torch.ones(16, 1), torch.zeros(16, 1)
    words = kernel.pack_q32_bf16(q, d, m, own_ext.AMX_BF16)[0, 0, :256].view(torch.int16)
    assert words[7].item() == 5 and int(words.abs().sum()) == 5


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16, 17])  # AMX: 17 = a tile of rows and one more
@pytest.mark.parametrize("n", [16, 80, 256])  # units of 1, 5 (4 + 1) and 16 blocks
def test_the_kernel_matches_its_reference(ext, name, rows, n):
    path = require_path(ext, PATHS, name)
    x, q, d, m = _operands(rows, n, 96)
    blocks = kernel.pack_q32_bf16(q, d, m, path)
    y = kernel.int4_bf16_gemm(ext, x, blocks, path)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert relative_error(y, kernel.int4_bf16_gemm_reference(x, blocks, path)) < TOLERANCE


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])  # 40: three passes over the groups dequantized once
def test_the_amx_path_is_the_bf16_gemm_on_the_dequantized_weight(ext, rows):
    """Bit for bit: the tiles see bf16(q d + m) (float32, one rounding), what a bfloat16 checkpoint dequantized from
    the same codes holds, and add the same tile products as the bfloat16 GEMM's AMX path."""
    path = require_path(ext, PATHS, "amx-bf16")
    x, q, d, m = _operands(rows, 80, 160, seed=5)
    w = (q.view(80, 5, 32).float() * d[..., None] + m[..., None]).view(80, 160).bfloat16()
    expected = bf16_gemm.bf16_gemm(ext, x, bf16_gemm.pack_bf16(w), own_ext.AMX_BF16)
    assert torch.equal(kernel.int4_bf16_gemm(ext, x, kernel.pack_q32_bf16(q, d, m, path), path), expected)


def test_the_tiles_hold_a_weight_exactly_unless_m_is_far_below_its_scale():
    _, _, d, m = _operands(1, 32, 64, seed=6)
    assert kernel.tiles_exact(d, m)
    m[3, 1] = torch.tensor(1e-6).half().float()  # m - 128 d needs more than float32's 24 bits
    assert not kernel.tiles_exact(d, m)


def test_the_reference_is_the_dequantized_weight():
    x, q, d, m = _operands(2, 32, 64, seed=1)
    w = (q.view(32, 2, 32).float() * d[..., None] + m[..., None]).view(32, 64)
    expected = torch.nn.functional.linear(x.float(), w).bfloat16()
    assert torch.equal(kernel.int4_bf16_gemm_reference(x, kernel.pack_q32_bf16(q, d, m)), expected)
    tiles = torch.nn.functional.linear(x.float(), w.bfloat16().float()).bfloat16()  # the AMX path's weights
    amx_blocks = kernel.pack_q32_bf16(q, d, m, own_ext.AMX_BF16)
    assert torch.equal(kernel.int4_bf16_gemm_reference(x, amx_blocks, own_ext.AMX_BF16), tiles)


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("rows", [3, 7, 13, 20])  # AVX512: passes of 3 rows, 7, 8 + 5; AMX: 20 = 16 + 4
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, name, rows):
    path = require_path(ext, PATHS, name)
    x, q, d, m = _operands(rows, 320, 128, seed=2)
    blocks = kernel.pack_q32_bf16(q, d, m, path)
    assert_rows_invariant(lambda rows: kernel.int4_bf16_gemm(ext, rows, blocks, path), x)


@pytest.mark.parametrize("name", PATHS)
def test_a_planted_layout_bug_is_caught(ext, name):
    """Codes whose chunks are read in the wrong order (inputs 2c.. taken for 2c + 2..) fail the comparison."""
    path = require_path(ext, PATHS, name)
    x, q, d, m = _operands(2, 32, 64, seed=3)
    blocks = kernel.pack_q32_bf16(q, d, m, path)
    wrong = blocks.clone()
    wrong[..., :256] = blocks[..., :256].view(2, 2, 4, 64).roll(1, dims=2).reshape(2, 2, 256)
    reference = kernel.int4_bf16_gemm_reference(x, blocks, path)
    assert relative_error(kernel.int4_bf16_gemm(ext, x, wrong, path), reference) > 0.1


def test_mismatched_operands_are_rejected(ext):
    _, q, d, m = _operands(1, 32, 64)
    blocks = kernel.pack_q32_bf16(q, d, m)
    with pytest.raises(ValueError, match="do not match"):
        kernel.int4_bf16_gemm(ext, torch.randn(1, 96).bfloat16(), blocks)
    with pytest.raises(ValueError, match="multiple of 16"):
        kernel.pack_q32_bf16(q[:24], d[:24], m[:24])
    if own_ext.BF16_AVX512 in own_ext.supported_paths(ext):
        with pytest.raises(RuntimeError, match="bfloat16 x"):
            ext.int4_bf16_gemm(torch.randn(1, 64), blocks, own_ext.BF16_AVX512)
        with pytest.raises(RuntimeError, match="the path is"):
            ext.int4_bf16_gemm(torch.randn(1, 64).bfloat16(), blocks, own_ext.FLOAT_AVX512)
