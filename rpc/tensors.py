"""ssd.v1.Tensor <-> numpy arrays, inline transport (the one that always works). No torch here."""

import numpy as np

from protos.ssd.v1 import common_pb2

_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}


def to_tensor(array: np.ndarray) -> common_pb2.Tensor:
    name = array.dtype.name
    if name not in _NUMPY_DTYPES:
        raise ValueError(f"unsupported tensor dtype {name}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return common_pb2.Tensor(dtype=name, shape=list(array.shape), inline_bytes=data.tobytes())


def from_tensor(tensor: common_pb2.Tensor) -> np.ndarray:
    if tensor.WhichOneof("data") != "inline_bytes":
        raise ValueError("only inline tensors are supported by this build")
    dtype = _NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype!r}")
    array = np.frombuffer(tensor.inline_bytes, dtype=np.dtype(dtype).newbyteorder("<"))
    return array.reshape(tuple(tensor.shape))
