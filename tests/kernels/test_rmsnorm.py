"""The Triton RMSNorm (plain and fused with the residual add) against its reference and ssd's RMSNorm."""

import pytest
import torch

pytest.importorskip("triton")

from ssd.layers.norm import RMSNorm  # noqa: E402
from ssd_kernels.rmsnorm import (  # noqa: E402
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from tests.kernels.tolerances import assert_close, assert_rounded_like  # noqa: E402


def _inputs(device, dtype, hidden):
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(5, hidden, generator=gen).to(dtype).to(device) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    return x, residual, weight


@pytest.mark.usefixtures("torch_layer_ops")  # the layer's torch ops: the rounding the reference mirrors
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [48, 64])
def test_rms_norm_matches_the_reference_and_the_layer(device, dtype, hidden):
    x, residual, weight = _inputs(device, dtype, hidden)
    layer = RMSNorm(hidden, eps=1e-6).to(device=device, dtype=dtype)
    layer.weight.data.copy_(weight)
    out = rms_norm(x, weight, 1e-6)
    assert out.dtype == dtype
    assert_close(out, rms_norm_reference(x, weight, 1e-6))
    assert torch.equal(rms_norm_reference(x, weight, 1e-6), layer(x))

    normed, summed = fused_add_rms_norm(x, residual, weight, 1e-6)
    ref_normed, ref_summed = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    assert_rounded_like(summed, ref_summed)
    assert_close(normed, ref_normed)
    layer_normed, layer_summed = layer(x, residual)
    assert torch.equal(ref_normed, layer_normed) and torch.equal(ref_summed, layer_summed)


def test_the_launcher_rejects_bad_inputs(device):
    x, residual, weight = _inputs(device, torch.float32, 48)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, weight[:10], 1e-6)
    with pytest.raises(ValueError, match="residual must have dtype"):
        fused_add_rms_norm(x, residual.half(), weight, 1e-6)
    with pytest.raises(ValueError, match="x must be contiguous"):
        rms_norm(x.t().contiguous().t(), weight, 1e-6)
    with pytest.raises(ValueError, match="x must be"):
        rms_norm(x[None], weight, 1e-6)
