"""The RoPE tables are shared by every model with the same settings: casting one model must not touch them."""

import torch

from ssd.layers.rotary import get_rope
from ssd.model_config import RopeConfig


def test_casting_a_model_leaves_the_shared_rope_tables_in_float32():
    rope = get_rope(16, 64, RopeConfig())
    model = torch.nn.Module()
    model.rope = rope
    model.to(torch.bfloat16)  # a bf16 model that shares the tables
    assert rope.cos.dtype == torch.float32 and rope.sin.dtype == torch.float32
    x = torch.randn(3, 2, 16)  # [T, heads, D] float32
    out = rope(torch.arange(3), x)
    ref = get_rope(16, 64, RopeConfig())(torch.arange(3), x.double())
    assert torch.allclose(out.double(), ref, atol=1e-6)
