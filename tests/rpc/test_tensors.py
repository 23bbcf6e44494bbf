"""Inline wire tensors: float32 and bfloat16 (as bit patterns) round-trip exactly; bad input is refused."""

import numpy as np
import pytest
import torch

from protos.ssd.v1 import common_pb2
from rpc.tensors import from_tensor, to_tensor


def test_float32_round_trip():
    array = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    msg = to_tensor(array)
    assert msg.dtype == "float32" and list(msg.shape) == [3, 5]
    assert np.array_equal(from_tensor(common_pb2.Tensor.FromString(msg.SerializeToString())), array)


def test_bfloat16_round_trip_through_torch():
    x = (torch.randn(4, 6) * 100).to(torch.bfloat16)  # [n, F]
    msg = to_tensor(x.view(torch.int16).numpy(), dtype="bfloat16")
    assert msg.dtype == "bfloat16" and len(msg.inline_bytes) == x.numel() * 2
    bits = from_tensor(common_pb2.Tensor.FromString(msg.SerializeToString()))
    back = torch.from_numpy(bits.copy()).view(torch.bfloat16)
    assert back.dtype == torch.bfloat16 and torch.equal(back, x)


def test_refuses_what_it_cannot_carry():
    with pytest.raises(ValueError, match="bfloat16"):
        to_tensor(np.zeros(3, np.float32), dtype="bfloat16")  # bit patterns must be 16-bit integers
    with pytest.raises(ValueError, match="unsupported"):
        to_tensor(np.zeros(3, np.float64))
    with pytest.raises(ValueError, match="unsupported"):
        from_tensor(common_pb2.Tensor(dtype="complex64", shape=[1], inline_bytes=b"\0" * 8))
    with pytest.raises(ValueError):
        from_tensor(common_pb2.Tensor(dtype="float32", shape=[3], inline_bytes=b"\0" * 8))  # 2 floats, not 3
