"""The Triton rotary embedding against its reference and ssd's RotaryEmbedding (the same rounding)."""

import pytest
import torch

pytest.importorskip("triton")

from ssd.layers.rotary import RotaryEmbedding  # noqa: E402
from ssd.model_config import RopeConfig  # noqa: E402
from ssd_kernels.rotary import rotary_embedding, rotary_embedding_reference  # noqa: E402
from tests.kernels.tolerances import assert_close  # noqa: E402

LLAMA3 = RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=64)
ROPES = [RopeConfig(), LLAMA3]


@pytest.mark.usefixtures("torch_layer_ops")  # the layer's torch ops: the rounding the reference mirrors
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rope", ROPES, ids=["default", "llama3"])
@pytest.mark.parametrize("heads", [1, 3])
def test_rotary_matches_the_reference_and_the_layer(device, dtype, rope, heads):
    gen = torch.Generator().manual_seed(0)
    layer = RotaryEmbedding(32, 256, rope)
    positions = torch.tensor([0, 1, 17, 255, 100, 3])
    x = torch.randn(6, heads, 32, generator=gen).to(dtype)
    expected = layer(positions, x)
    assert torch.equal(rotary_embedding_reference(x, positions, layer.cos, layer.sin), expected)
    out = rotary_embedding(x.to(device), positions.to(device), layer.cos.to(device), layer.sin.to(device))
    assert out.dtype == dtype
    assert_close(out.cpu(), expected)


def test_strided_heads_of_a_fused_qkv_row(device):
    qkv = torch.randn(4, 5, 16).to(device)  # [T, q heads + k heads, D]: rotate a view of the 3 q heads
    layer = RotaryEmbedding(16, 32, RopeConfig())
    positions = torch.tensor([3, 0, 31, 7], device=device)
    cos, sin = layer.cos.to(device), layer.sin.to(device)
    out = rotary_embedding(qkv[:, :3], positions, cos, sin)
    assert_close(out, rotary_embedding_reference(qkv[:, :3], positions, cos, sin))


def test_the_launcher_rejects_bad_inputs(device):
    layer = RotaryEmbedding(16, 32, RopeConfig())
    x = torch.randn(4, 2, 16, device=device)
    positions = torch.arange(4, device=device)
    cos, sin = layer.cos.to(device), layer.sin.to(device)
    with pytest.raises(ValueError, match="positions must have dtype"):
        rotary_embedding(x, positions.float(), cos, sin)
    with pytest.raises(ValueError, match="cos must be"):
        rotary_embedding(x, positions, cos[:, :8].contiguous(), sin)
    with pytest.raises(ValueError, match="cos must have dtype"):
        rotary_embedding(x, positions, cos.half(), sin.half())
    with pytest.raises(ValueError, match="even, contiguous head dimension"):
        rotary_embedding(x[..., :15], positions, cos, sin)
