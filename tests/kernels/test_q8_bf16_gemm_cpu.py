"""The CPU int8 GEMM for bfloat16 activations (ssd_kernels/cpu/q8_bf16_gemm: AVX512-BF16, and AMX-BF16 tiles of the
dequantized weights; the Q8_0 LM head of a bfloat16 model): against its plain-torch reference, batch and thread
invariance, the AMX path against the bfloat16 GEMM on the dequantized weight, the layout, a planted layout bug, and
the errors. Each path is skipped where the CPU does not run it."""

import pytest
import torch

from ssd_kernels.cpu import bf16_gemm
from ssd_kernels.cpu import extension as own_ext
from ssd_kernels.cpu import q8_bf16_gemm as kernel
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"bf16-avx512": own_ext.BF16_AVX512, "amx-bf16": own_ext.AMX_BF16}
TOLERANCE = 1e-2  # relative to max |reference|: the output's bfloat16 rounding


def _operands(rows: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, K] bfloat16, q [N, K] -128..127 (both ends included), d [N, K / 32] exact in fp16."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    q = torch.randint(-128, 128, (n, k), generator=g)
    q[0, :2] = torch.tensor([-128, 127])
    d = (torch.rand(n, k // 32, generator=g) / (64 * k**0.5)).half().float()
    return x, q, d


def test_the_layout_round_trips():
    _, q, d = _operands(1, 48, 96)
    q2, d2 = kernel.unpack_q8_bf16(kernel.pack_q8_bf16(q, d))
    assert torch.equal(q2.long(), q) and torch.equal(d2, d)


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16, 17])
@pytest.mark.parametrize("n", [16, 80, 256])  # units of 1, 5 (4 + 1) and 16 blocks
def test_the_kernel_matches_its_reference(ext, name, rows, n):
    path = require_path(ext, PATHS, name)
    x, q, d = _operands(rows, n, 96)
    blocks = kernel.pack_q8_bf16(q, d)
    y = kernel.q8_bf16_gemm(ext, x, blocks, path)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert relative_error(y, kernel.q8_bf16_gemm_reference(x, blocks, path)) < TOLERANCE


@pytest.mark.parametrize("rows", [1, 5, 17, 40])  # 40: three passes over the groups dequantized once
def test_the_amx_path_is_the_bf16_gemm_on_the_dequantized_weight(ext, rows):
    """Bit for bit: the tiles see bf16(q d) (exact in float32), and add the bfloat16 GEMM's tile products."""
    path = require_path(ext, PATHS, "amx-bf16")
    x, q, d = _operands(rows, 80, 160, seed=5)
    w = (q.view(80, 5, 32).float() * d[..., None]).view(80, 160).bfloat16()
    expected = bf16_gemm.bf16_gemm(ext, x, bf16_gemm.pack_bf16(w), own_ext.AMX_BF16)
    assert torch.equal(kernel.q8_bf16_gemm(ext, x, kernel.pack_q8_bf16(q, d), path), expected)


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("rows", [3, 7, 13, 20])  # AVX512: passes of 3 rows, 7, 8 + 5; AMX: 20 = 16 + 4
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, name, rows):
    path = require_path(ext, PATHS, name)
    x, q, d = _operands(rows, 320, 128, seed=2)
    blocks = kernel.pack_q8_bf16(q, d)
    assert_rows_invariant(lambda rows: kernel.q8_bf16_gemm(ext, rows, blocks, path), x)


@pytest.mark.parametrize("name", PATHS)
def test_a_planted_layout_bug_is_caught(ext, name):
    """Codes laid out input-major within a chunk (16 features' first inputs, then their second ones) fail."""
    path = require_path(ext, PATHS, name)
    x, q, d = _operands(2, 32, 64, seed=3)
    blocks = kernel.pack_q8_bf16(q, d)
    wrong = blocks.clone()
    wrong[..., :512] = blocks[..., :512].view(2, 2, 16, 16, 2).transpose(3, 4).reshape(2, 2, 512)
    reference = kernel.q8_bf16_gemm_reference(x, blocks, path)
    assert relative_error(kernel.q8_bf16_gemm(ext, x, wrong, path), reference) > 0.1


def test_mismatched_operands_are_rejected(ext):
    _, q, d = _operands(1, 32, 64)
    blocks = kernel.pack_q8_bf16(q, d)
    with pytest.raises(ValueError, match="do not match"):
        kernel.q8_bf16_gemm(ext, torch.randn(1, 96).bfloat16(), blocks)
    with pytest.raises(ValueError, match="multiple of 16"):
        kernel.pack_q8_bf16(q[:24], d[:24])
    if own_ext.BF16_AVX512 in own_ext.supported_paths(ext):
        with pytest.raises(RuntimeError, match="bfloat16 x"):
            ext.q8_bf16_gemm(torch.randn(1, 64), blocks, own_ext.BF16_AVX512)
