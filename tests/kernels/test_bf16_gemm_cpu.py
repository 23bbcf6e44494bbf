"""The CPU bfloat16 GEMM (ssd_kernels/cpu/bf16_gemm: AVX512-BF16, and AMX-BF16 tiles on the same blocks): against
its plain-torch reference, batch and thread invariance (a verify row gets a decode step's bits), the layout, a planted
layout bug, the path a weight takes, and the errors. Each path is skipped where the CPU does not run it."""

import pytest
import torch

from ssd_kernels.cpu import bf16_gemm
from ssd_kernels.cpu import extension as own_ext
from tests.kernels.cpu_kernel_checks import assert_rows_invariant, relative_error, require_path

PATHS = {"bf16-avx512": own_ext.BF16_AVX512, "amx-bf16": own_ext.AMX_BF16}
# Relative to max |reference|: the output's bfloat16 rounding, and each pair's two products summed in float32
# before they join the sum.
TOLERANCE = 1e-2


def _operands(rows: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) / k**0.5).bfloat16()


def test_the_layout_round_trips():
    _, w = _operands(1, 48, 10)
    assert torch.equal(bf16_gemm.unpack_bf16(bf16_gemm.pack_bf16(w)), w)


@pytest.mark.parametrize("name", PATHS)
# AMX: one tile of rows, a tile and one more, three passes (the last short, or full), four passes
@pytest.mark.parametrize("rows", [1, 3, 5, 16, 17, 33, 48, 50])
@pytest.mark.parametrize("n", [16, 80, 256])  # units of 1, 5 (4 + 1) and 16 blocks
def test_the_kernel_matches_its_reference(ext, name, rows, n):
    path = require_path(ext, PATHS, name)
    x, w = _operands(rows, n, 96)
    blocks = bf16_gemm.pack_bf16(w)
    y = bf16_gemm.bf16_gemm(ext, x, blocks, path)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert relative_error(y, bf16_gemm.bf16_gemm_reference(x, blocks)) < TOLERANCE


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("rows", [21, 50])  # AMX: passes of 16 and 5 rows; of 16, 16, 16 and 2
def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_two_threads(ext, name, rows):
    path = require_path(ext, PATHS, name)
    x, w = _operands(rows, 320, 128, seed=2)
    blocks = bf16_gemm.pack_bf16(w)
    assert_rows_invariant(lambda rows: bf16_gemm.bf16_gemm(ext, rows, blocks, path), x)


@pytest.mark.parametrize("name", PATHS)
def test_a_planted_layout_bug_is_caught(ext, name):
    """Blocks whose pairs are laid out input-feature-major (16 features' first weights, then their second ones)
    fail the comparison."""
    path = require_path(ext, PATHS, name)
    x, w = _operands(2, 32, 64, seed=3)
    blocks = bf16_gemm.pack_bf16(w)
    wrong = blocks.view(2, 32, 16, 2).transpose(2, 3).reshape(2, 32, 32).contiguous()
    assert relative_error(bf16_gemm.bf16_gemm(ext, x, wrong, path), bf16_gemm.bf16_gemm_reference(x, blocks)) > 0.1


def test_a_weight_takes_amx_where_the_cpu_runs_it_and_its_inputs_fill_tiles(ext):
    paths = own_ext.supported_paths(ext)
    if own_ext.BF16_AVX512 not in paths:
        assert bf16_gemm.path_for(ext, 576) is None
        return
    amx = own_ext.AMX_BF16 in paths
    assert bf16_gemm.path_for(ext, 576) == (own_ext.AMX_BF16 if amx else own_ext.BF16_AVX512)
    assert bf16_gemm.path_for(ext, 576, amx=False) == own_ext.BF16_AVX512
    assert bf16_gemm.path_for(ext, 100) == own_ext.BF16_AVX512  # 100 inputs: no whole tile of 32


@pytest.mark.parametrize("setting", [None, "0", "off"])
def test_a_model_layer_takes_the_amx_path_unless_switched_off(ext, monkeypatch, setting):
    """A bfloat16 linear layer's own matmul (cpu_kernels.own_matmul_for) runs AMX where the CPU has it, unless
    SSD_CPU_AMX says no; either way it gives the reference's values."""
    from ssd.layers import cpu_kernels

    if own_ext.BF16_AVX512 not in own_ext.supported_paths(ext):
        pytest.skip("this CPU has no AVX512-BF16")
    if setting is None:
        monkeypatch.delenv(cpu_kernels.AMX_ENV, raising=False)
    else:
        monkeypatch.setenv(cpu_kernels.AMX_ENV, setting)
    x, w = _operands(5, 64, 96, seed=4)
    own = cpu_kernels.own_matmul_for(w)
    amx = setting is None and own_ext.AMX_BF16 in own_ext.supported_paths(ext)
    assert own is not None and own.path == (own_ext.AMX_BF16 if amx else own_ext.BF16_AVX512)
    with torch.no_grad():
        assert relative_error(own(x), bf16_gemm.bf16_gemm_reference(x, own.tensor)) < TOLERANCE


def test_mismatched_operands_are_rejected(ext):
    x, w = _operands(1, 32, 64)
    with pytest.raises(ValueError, match="do not match"):
        bf16_gemm.bf16_gemm(ext, torch.randn(1, 96).bfloat16(), bf16_gemm.pack_bf16(w))
    with pytest.raises(ValueError, match="multiple of 16"):
        bf16_gemm.pack_bf16(w[:24])
    with pytest.raises(ValueError, match="bfloat16 weights"):
        bf16_gemm.pack_bf16(w.float())
    if own_ext.AMX_BF16 in own_ext.supported_paths(ext):
        with pytest.raises(RuntimeError, match="multiple of 32"):  # K = 48: the AMX path needs whole tiles
            ext.bf16_gemm(torch.randn(1, 48).bfloat16(), bf16_gemm.pack_bf16(_operands(1, 16, 48)[1]),
                          own_ext.AMX_BF16)
    with pytest.raises(RuntimeError, match="path"):
        ext.bf16_gemm(x, bf16_gemm.pack_bf16(w), 3)
