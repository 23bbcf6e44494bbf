"""ssd.v1.Tensor <-> numpy arrays, inline transport (the one that always works). No torch here.

bfloat16 travels as its raw 16-bit patterns: numpy has no bfloat16, so `to_tensor(bits, dtype="bfloat16")`
takes them as an int16 / uint16 array and `from_tensor` gives them back as uint16; torch code views
them as bfloat16 (`torch.from_numpy(bits).view(torch.bfloat16)`).
"""

import numpy as np

from protos.ssd.v1 import common_pb2

_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}
_RAW_DTYPES = {"bfloat16": np.uint16}  # wire dtype -> numpy type holding its bit patterns


def wire_dtype(tensor: common_pb2.Tensor) -> np.dtype:
    """The little-endian numpy dtype that holds `tensor`'s elements (bit patterns for bfloat16)."""
    dtype = _NUMPY_DTYPES.get(tensor.dtype) or _RAW_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype!r}")
    return np.dtype(dtype).newbyteorder("<")


def to_tensor(array: np.ndarray, dtype: str | None = None) -> common_pb2.Tensor:
    """Inline tensor of `array`; `dtype="bfloat16"` marks a 16-bit integer array as bfloat16 bit patterns."""
    name = dtype or array.dtype.name
    if name in _RAW_DTYPES:
        if array.dtype.itemsize != np.dtype(_RAW_DTYPES[name]).itemsize or array.dtype.kind not in "iu":
            raise ValueError(f"{name} travels as 16-bit integer bit patterns, got {array.dtype.name}")
        array = array.view(_RAW_DTYPES[name])
    elif name != array.dtype.name or name not in _NUMPY_DTYPES:
        raise ValueError(f"unsupported tensor dtype {name} for an array of {array.dtype.name}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return common_pb2.Tensor(dtype=name, shape=list(array.shape), inline_bytes=data.tobytes())


def from_tensor(tensor: common_pb2.Tensor) -> np.ndarray:
    """A read-only view of an inline tensor's bytes (uint16 bit patterns for bfloat16)."""
    if tensor.WhichOneof("data") != "inline_bytes":
        raise ValueError("only inline tensors are supported by this build")
    array = np.frombuffer(tensor.inline_bytes, dtype=wire_dtype(tensor))
    return array.reshape(tuple(tensor.shape))
