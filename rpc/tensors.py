"""ssd.v1.Tensor <-> numpy arrays: inline bytes (always works) or a same-node shared-memory handle. No torch here.

bfloat16 travels as its raw 16-bit patterns: numpy has no bfloat16, so `to_tensor(bits, dtype="bfloat16")`
takes them as an int16 / uint16 array and decoding gives them back as uint16; torch code views them as
bfloat16 (`torch.from_numpy(bits).view(torch.bfloat16)`). A session negotiates its transport once
(SessionTensors: Hello offers CUDA IPC and / or shared memory, each with a probe, Ready settles it); inline
is the fallback. GPU tensors go through a `DeviceChannel` the model services plug in (rpc/cuda_ipc.py);
rpc/torch_tensors.py is the torch-side entry point that picks the path for a tensor.
"""

import secrets
import threading
from typing import Any, NamedTuple, Protocol

import numpy as np
import structlog

from protos.ssd.v1 import common_pb2
from rpc import shared_memory
from rpc.shared_memory import SegmentReader, SegmentWriter

log = structlog.get_logger(__name__)

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

INLINE = common_pb2.TENSOR_TRANSPORT_INLINE
SHARED_MEMORY = common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY
CUDA_IPC = common_pb2.TENSOR_TRANSPORT_CUDA_IPC


class DeviceChannel(Protocol):
    """GPU tensors of one session side (rpc/cuda_ipc.CudaIpcChannel); tensors are torch tensors there."""

    def probe(self) -> common_pb2.Tensor | None: ...
    def start_message(self, num_bytes: int) -> None: ...
    def put(self, tensor: Any) -> common_pb2.Tensor | None: ...
    def read(self, tensor: common_pb2.Tensor) -> Any: ...
    def close(self) -> None: ...


class Offer(NamedTuple):
    """What a target's Hello offers: transports in preference order and their probes."""
    transports: list[int]
    shm_probe: common_pb2.Tensor | None
    cuda_probe: common_pb2.Tensor | None


class SessionTensors:
    """One session's tensors, either side: written inline or, once agreed, into this side's shared-memory
    segment (host tensors) or device buffer (GPU tensors, CUDA IPC); read from any. Inline always works.
    Thread-safe: a session may be closed by another thread than the one encoding (the writes then go inline).
    """

    def __init__(self, device: DeviceChannel | None = None) -> None:
        self._lock = threading.Lock()
        self._writer: SegmentWriter | None = None
        self._reader = SegmentReader()
        self._device = device  # None: this side has no GPU channel (CPU engine, or CUDA IPC turned off)
        self.transport = INLINE

    # -- negotiation (Hello / Ready) --------------------------------------------------------------
    def offer(self, enabled: bool = True) -> Offer:
        """Target side: the transports for Hello with their probes (CUDA IPC first, then shared memory)."""
        cuda_probe = self._device_probe() if enabled else None
        shm_probe = self._shm_probe() if enabled else None
        transports = [CUDA_IPC] * (cuda_probe is not None) + [SHARED_MEMORY] * (shm_probe is not None) + [INLINE]
        return Offer(transports, shm_probe, cuda_probe)

    def _device_probe(self) -> common_pb2.Tensor | None:
        if self._device is None:
            return None
        try:
            return self._device.probe()
        except (RuntimeError, ValueError) as e:  # no room on the GPU, IPC refused by the driver
            log.warning("no CUDA IPC buffer; GPU tensors go another way", error=str(e))
            return None

    def _shm_probe(self) -> common_pb2.Tensor | None:
        if not shared_memory.is_available():
            return None
        writer = SegmentWriter()
        writer.start_message(8)
        probe = writer.put(np.array([secrets.randbits(62)], dtype="<i8"), "int64")
        if probe is None:
            writer.close()
            return None
        with self._lock:
            self._writer = writer
        return probe

    def accept(self, transports: list[int], probe: common_pb2.Tensor | None,
               cuda_probe: common_pb2.Tensor | None = None) -> int:
        """Draft side: CUDA_IPC if offered and its probe opens here (same node, same GPU visible); else
        SHARED_MEMORY if offered and its probe reads here; else INLINE. Host tensors (q) go through this
        side's shared memory whenever the shared-memory probe read, also beside CUDA IPC."""
        shm_ok = SHARED_MEMORY in transports and shared_memory.is_available() and self._reads(probe, False)
        if shm_ok:
            writer = SegmentWriter()
            with self._lock:
                self._writer = writer if writer.segment is not None else None
        if CUDA_IPC in transports and self._device is not None and self._reads(cuda_probe, True):
            return self.settle(CUDA_IPC, keep_shared_memory=shm_ok)
        return self.settle(SHARED_MEMORY if shm_ok else INLINE)

    def _reads(self, probe: common_pb2.Tensor | None, on_device: bool) -> bool:
        if probe is None or probe.WhichOneof("data") != "handle":
            return False
        read = self.decode_device if on_device else self.decode
        try:
            read(probe)
        except (ValueError, OSError, RuntimeError) as e:  # another node, another /dev/shm, a GPU not seen here
            log.info("tensor probe unreadable", transport="CUDA_IPC" if on_device else "SHARED_MEMORY", error=str(e))
            return False
        return True

    def settle(self, transport: int, keep_shared_memory: bool = False) -> int:
        """Use `transport` from now on. A side that does not write shared memory drops its segment (with
        CUDA IPC it keeps it for host tensors when `keep_shared_memory`); without CUDA IPC the device
        channel is closed."""
        with self._lock:
            keep_shm = transport == SHARED_MEMORY or (transport == CUDA_IPC and keep_shared_memory)
            if not keep_shm and self._writer is not None:
                self._writer.close()
                self._writer = None
            if transport != CUDA_IPC and self._device is not None:
                self._device.close()
                self._device = None
            if transport == CUDA_IPC:
                self.transport = CUDA_IPC if self._device is not None else INLINE
            else:
                self.transport = transport if self._writer is not None else INLINE
        return self.transport

    # -- one message's tensors --------------------------------------------------------------------
    def start_message(self, num_bytes: int) -> None:
        """Before encoding a message's tensors (`num_bytes` in all): the previous message's were read."""
        with self._lock:
            if self._writer is not None:
                self._writer.start_message(num_bytes)
            if self._device is not None and self.transport == CUDA_IPC:
                self._device.start_message(num_bytes)

    def encode_device(self, tensor: Any) -> common_pb2.Tensor | None:
        """A GPU tensor by CUDA IPC when agreed and it fits; None: send it as a host array instead."""
        with self._lock:
            if self._device is None or self.transport != CUDA_IPC:
                return None
            return self._device.put(tensor)

    def decode_device(self, tensor: common_pb2.Tensor) -> Any:
        """A CUDA IPC tensor, copied onto this side's GPU (a torch tensor)."""
        with self._lock:
            if self._device is None:
                raise ValueError("a CUDA IPC tensor arrived, but this side has no CUDA IPC channel")
            return self._device.read(tensor)

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
        if tensor.handle.transport == CUDA_IPC:
            raise ValueError("a CUDA IPC tensor is read with decode_device")
        with self._lock:
            return self._reader.read(tensor, wire_dtype(tensor))

    def close(self) -> None:
        """Unlink this side's segment, unmap the peer's, drop the GPU buffers (idempotent)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if self._device is not None:
                self._device.close()
                self._device = None
            self._reader.close()
