"""ssd.v1.Tensor <-> numpy arrays: inline bytes (always works) or a same-node shared-memory handle. No torch here.

bfloat16 travels as its raw 16-bit patterns: numpy has no bfloat16, so `to_tensor(bits, dtype="bfloat16")`
takes them as an int16 / uint16 array and decoding gives them back as uint16; torch code views them as
bfloat16 (`torch.from_numpy(bits).view(torch.bfloat16)`). A session negotiates its transport once
(SessionTensors: Hello offers shared memory with a probe, Ready settles it); inline is the fallback.
"""

import secrets
import threading

import numpy as np

from protos.ssd.v1 import common_pb2
from rpc import shared_memory
from rpc.shared_memory import SegmentReader, SegmentWriter

_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}
_RAW_DTYPES = {"bfloat16": np.uint16}  # wire dtype -> numpy type holding its bit patterns


def wire_dtype(tensor: common_pb2.Tensor) -> np.dtype:
    """The little-endian numpy dtype that holds `tensor`'s elements (bit patterns for bfloat16)."""
    dtype = _NUMPY_DTYPES.get(tensor.dtype) or _RAW_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype!r}")
    return np.dtype(dtype).newbyteorder("<")


def wire_array(array: np.ndarray, dtype: str | None = None) -> tuple[np.ndarray, str]:
    """(contiguous little-endian elements, wire dtype name); `dtype="bfloat16"` marks 16-bit integer bits."""
    name = dtype or array.dtype.name
    if name in _RAW_DTYPES:
        if array.dtype.itemsize != np.dtype(_RAW_DTYPES[name]).itemsize or array.dtype.kind not in "iu":
            raise ValueError(f"{name} travels as 16-bit integer bit patterns, got {array.dtype.name}")
        array = array.view(_RAW_DTYPES[name])
    elif name != array.dtype.name or name not in _NUMPY_DTYPES:
        raise ValueError(f"unsupported tensor dtype {name} for an array of {array.dtype.name}")
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")), name


def to_tensor(array: np.ndarray, dtype: str | None = None) -> common_pb2.Tensor:
    """Inline tensor of `array`; `dtype="bfloat16"` marks a 16-bit integer array as bfloat16 bit patterns."""
    data, name = wire_array(array, dtype)
    return common_pb2.Tensor(dtype=name, shape=list(data.shape), inline_bytes=data.tobytes())


def from_tensor(tensor: common_pb2.Tensor) -> np.ndarray:
    """A read-only view of an inline tensor's bytes (uint16 bit patterns for bfloat16)."""
    if tensor.WhichOneof("data") != "inline_bytes":
        raise ValueError("not an inline tensor; a session's SessionTensors.decode reads handles")
    array = np.frombuffer(tensor.inline_bytes, dtype=wire_dtype(tensor))
    return array.reshape(tuple(tensor.shape))

class SessionTensors:
    """One session's tensors, either side: written inline or, once agreed, into this side's shared-memory
    segment; read from either. Inline always works. Thread-safe: a session may be closed by another thread
    than the one encoding (the writes then go inline).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writer: SegmentWriter | None = None
        self._reader = SegmentReader()
        self.transport = common_pb2.TENSOR_TRANSPORT_INLINE

    # -- negotiation (Hello / Ready) --------------------------------------------------------------
    def offer(self, enabled: bool = True) -> tuple[list[int], common_pb2.Tensor | None]:
        """Target side: the transports for Hello and the shared-memory probe (in this side's new segment)."""
        inline = [common_pb2.TENSOR_TRANSPORT_INLINE]
        if not enabled or not shared_memory.is_available():
            return inline, None
        writer = SegmentWriter()
        writer.start_message(8)
        probe = writer.put(np.array([secrets.randbits(62)], dtype="<i8"), "int64")
        if probe is None:
            writer.close()
            return inline, None
        with self._lock:
            self._writer = writer
        return [common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY, *inline], probe

    def accept(self, transports: list[int], probe: common_pb2.Tensor | None) -> int:
        """Draft side: SHARED_MEMORY if offered, the probe reads here (same node) and this side has a segment."""
        offered = common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY in transports and shared_memory.is_available()
        if not offered or probe is None or probe.WhichOneof("data") != "handle":
            return self.settle(common_pb2.TENSOR_TRANSPORT_INLINE)
        try:
            self.decode(probe)
        except (ValueError, OSError):  # another node (or another /dev/shm): inline
            return self.settle(common_pb2.TENSOR_TRANSPORT_INLINE)
        writer = SegmentWriter()
        with self._lock:
            self._writer = writer if writer.segment is not None else None
        return self.settle(common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY)

    def settle(self, transport: int) -> int:
        """Use `transport` from now on (a side that does not write shared memory drops its segment)."""
        with self._lock:
            if transport != common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY and self._writer is not None:
                self._writer.close()
                self._writer = None
            self.transport = transport if self._writer is not None else common_pb2.TENSOR_TRANSPORT_INLINE
        return self.transport

    # -- one message's tensors --------------------------------------------------------------------
    def start_message(self, num_bytes: int) -> None:
        """Before encoding a message's tensors (`num_bytes` in all): the previous message's were read."""
        with self._lock:
            if self._writer is not None:
                self._writer.start_message(num_bytes)

    def encode(self, array: np.ndarray, dtype: str | None = None) -> common_pb2.Tensor:
        """Like `to_tensor`, into shared memory when agreed and there is room."""
        data, name = wire_array(array, dtype)
        with self._lock:
            tensor = self._writer.put(data, name) if self._writer is not None else None
        if tensor is None:
            tensor = common_pb2.Tensor(dtype=name, shape=list(data.shape), inline_bytes=data.tobytes())
        return tensor

    def decode(self, tensor: common_pb2.Tensor) -> np.ndarray:
        """A writable copy of the tensor's elements, inline or in the peer's segment (bfloat16 as uint16 bits)."""
        if tensor.WhichOneof("data") == "inline_bytes":
            return from_tensor(tensor).copy()
        if tensor.WhichOneof("data") != "handle":
            raise ValueError("a tensor needs inline bytes or a handle")
        with self._lock:
            return self._reader.read(tensor, wire_dtype(tensor))

    def close(self) -> None:
        """Unlink this side's segment, unmap the peer's (idempotent)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._reader.close()
