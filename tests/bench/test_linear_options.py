"""bench.linear_options: every matmul option it times computes the same x @ w.T (bf16 tolerance), padding included."""

import pytest
import torch
import torch.nn.functional as F

from bench.linear_options import _padded, float_options, quantized_options, report

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN packing needs mkldnn")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5, 16, 17])
def test_float_options_equal_f_linear(rows):
    torch.manual_seed(0)
    w = torch.randn(96, 64) * 0.05  # [N, K]
    x = torch.randn(rows, 64).bfloat16()  # [M, K]
    reference = F.linear(x.float(), w.bfloat16().float())  # [M, N] float32 product of the bf16 operands
    for name, fn in float_options(w).items():
        y = fn(x)
        assert y.shape == (rows, 96), name
        torch.testing.assert_close(y.float(), reference, atol=2e-2, rtol=2e-2, msg=name)


def test_padding_is_sliced_off():
    calls = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x * 2

    x = torch.randn(3, 4)
    torch.testing.assert_close(_padded(fn, 16)(x), x * 2)
    torch.testing.assert_close(_padded(fn, 16)(torch.randn(16, 4)).shape, torch.Size([16, 4]))
    assert calls == [16, 16]


@needs_onednn
def test_quantized_options_are_close():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    x = torch.randn(2, 128).bfloat16()
    reference = F.linear(x.float(), w)
    for name, fn in quantized_options(w).items():
        error = (fn(x).float() - reference).abs().max()
        assert error < 0.12 * reference.abs().max(), name  # int4 g32 / int8 weight rounding, not a wrong product


def test_report_counts_bytes_per_dtype(capsys):
    shapes_ms = {"qkv": 1.0, "o": 1.0, "gate_up": 1.0, "down": 1.0, "lm_head": 1.0}
    rows = report(1, {"bf16 x": shapes_ms, "fp32 x": shapes_ms}, bandwidth=10.0)
    bf16, fp32 = rows
    assert fp32["gb_s"] == pytest.approx(2 * bf16["gb_s"], rel=0.01)  # same time, twice the bytes
    assert bf16["total_ms"] == 5.0
    assert '"option": "bf16 x"' in capsys.readouterr().out
