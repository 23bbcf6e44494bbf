"""Same-node GPU tensor bytes: one CUDA buffer per writer and session, shared by CUDA IPC handle.

The GPU twin of rpc/shared_memory.py. A writer owns one device buffer per session and reuses it from
offset 0 for every message (one message in flight per direction; the reader copies a message's tensors
before it answers). The buffer's IPC handle travels in each TensorHandle with the writer's device UUID
(the reader opens it on the GPU with that UUID, whatever its own device numbering) and the writer's epoch
(random per writer: a handle from another writer than the one this session first heard from is refused).
Copies are synchronized on both sides: the writer's bytes are on the device before the handle leaves, and
the reader's copy is done before it returns.

This is the one module of rpc/ that imports torch; only the model services import it (the import
contracts keep the gateway off it). It uses torch's own CUDA IPC (`reduce_tensor` / `rebuild_cuda_tensor`,
what torch.multiprocessing sends), so the producer's block stays alive until every reader has let go.
"""

import secrets
import struct

import structlog
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from protos.ssd.v1 import common_pb2

log = structlog.get_logger(__name__)

_ALIGN = 256  # tensor offsets inside the buffer (any dtype's alignment)
MIN_BUFFER_BYTES = 1 << 20
MAX_BUFFER_BYTES = 1 << 30  # a message that needs more goes inline
_HEADER = struct.Struct("<QQQ?HHH")  # storage bytes, storage offset, ref-counter offset, event sync, 3 lengths
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int32": torch.int32, "int64": torch.int64}
_WIRE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
CUDA_IPC = common_pb2.TENSOR_TRANSPORT_CUDA_IPC


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def device_uuid(device: torch.device) -> str:
    """The GPU's UUID: the same in every process of the node, whatever CUDA_VISIBLE_DEVICES numbers it."""
    return str(torch.cuda.get_device_properties(device).uuid)


def local_index(uuid: str) -> int:
    """This process's index of the GPU with `uuid`; ValueError when it cannot see it."""
    for i in range(torch.cuda.device_count()):
        if device_uuid(torch.device("cuda", i)) == uuid:
            return i
    raise ValueError(f"CUDA device {uuid} is not visible to this process")


def _pack(buffer: torch.Tensor) -> bytes:
    """The IPC handle of `buffer`'s whole allocation, as bytes (no pickle crosses the wire)."""
    _, args = reduce_tensor(buffer)
    handle, size, offset, ref_handle, ref_offset, event_handle, event_sync = args[7:10] + args[11:15]
    return _HEADER.pack(size, offset, ref_offset, bool(event_sync), len(handle), len(ref_handle),
                        len(event_handle)) + handle + ref_handle + event_handle


def _unpack(data: bytes) -> tuple[bytes, int, int, bytes, int, bytes, bool]:
    """(handle, storage bytes, storage offset, ref-counter handle, its offset, event handle, event sync)."""
    if len(data) < _HEADER.size:
        raise ValueError("CUDA IPC handle is too short")
    size, offset, ref_offset, event_sync, n_handle, n_ref, n_event = _HEADER.unpack_from(data)
    body = data[_HEADER.size:]
    if len(body) != n_handle + n_ref + n_event:
        raise ValueError("CUDA IPC handle has the wrong length")
    handle, ref_handle, event_handle = body[:n_handle], body[n_handle:n_handle + n_ref], body[n_handle + n_ref:]
    return handle, size, offset, ref_handle, ref_offset, event_handle, event_sync


class CudaIpcChannel:
    """One session side's GPU tensors: writes into its own device buffer, reads from the peer's by handle."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA IPC needs a CUDA device, got {device}")
        self.device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        self.uuid = device_uuid(self.device)
        self.epoch = secrets.randbits(63) or 1  # 0 would read as "unset"
        self.buffer: torch.Tensor | None = None  # [bytes] uint8 on self.device
        self.handle = b""  # the packed IPC handle of `buffer`
        self.offset = 0  # next free byte of the current message
        self.message_bytes = 0  # the current message's tensors, in all (start_message)
        self.peer_epoch: int | None = None  # the epoch of the first handle read on this session
        self.peer_key: bytes | None = None  # device UUID + handle of the peer buffer currently opened
        self.peer_buffer: torch.Tensor | None = None

    # -- writing ------------------------------------------------------------------------------------
    def start_message(self, num_bytes: int) -> None:
        """Reuse the buffer from offset 0 for a message of `num_bytes`; the first put makes room."""
        self.offset = 0
        self.message_bytes = num_bytes

    def _make_room(self) -> None:
        """A bigger buffer when this message needs more (allocated only by a side that sends GPU tensors)."""
        need = _aligned(self.message_bytes) + _ALIGN * 16  # slack for per-tensor alignment
        if need > MAX_BUFFER_BYTES or (self.buffer is not None and self.buffer.numel() >= need):
            return
        size = max(MIN_BUFFER_BYTES, need, 2 * (self.buffer.numel() if self.buffer is not None else 0))
        self.buffer = torch.empty(min(size, MAX_BUFFER_BYTES), dtype=torch.uint8, device=self.device)
        self.handle = _pack(self.buffer)  # the old buffer lives on until its reader lets go (torch's refcount)

    def put(self, tensor: torch.Tensor) -> common_pb2.Tensor | None:
        """`tensor` (on this channel's GPU) into the buffer; None when it does not fit or lives elsewhere."""
        name = _WIRE_NAMES.get(tensor.dtype)
        if name is None or tensor.device != self.device:
            return None
        if self.offset == 0:
            self._make_room()
        nbytes = tensor.numel() * tensor.element_size()
        if self.buffer is None or self.offset + nbytes > self.buffer.numel():
            return None
        start = self.offset
        self.buffer[start:start + nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
        torch.cuda.current_stream(self.device).synchronize()  # the bytes are there before the handle leaves
        self.offset = _aligned(start + nbytes)
        handle = common_pb2.TensorHandle(transport=CUDA_IPC, handle=self.handle, offset=start,
                                         device_uuid=self.uuid, epoch=self.epoch)
        return common_pb2.Tensor(dtype=name, shape=list(tensor.shape), handle=handle)

    def probe(self) -> common_pb2.Tensor | None:
        """A one-element tensor in this side's buffer, for the peer to open once at session start."""
        self.start_message(8)
        return self.put(torch.tensor([secrets.randbits(62)], dtype=torch.int64, device=self.device))

    # -- reading ------------------------------------------------------------------------------------
    def _open(self, handle: common_pb2.TensorHandle) -> torch.Tensor:
        """The peer's whole buffer, [bytes] uint8, opened once per buffer (the latest one only)."""
        if self.peer_epoch is None:
            self.peer_epoch = handle.epoch
        elif handle.epoch != self.peer_epoch:
            raise ValueError(f"CUDA IPC handle from producer epoch {handle.epoch}, this session's producer is "
                             f"epoch {self.peer_epoch}: a stale handle")
        key = handle.device_uuid.encode() + b"/" + handle.handle
        if key != self.peer_key or self.peer_buffer is None:
            index = local_index(handle.device_uuid)
            ipc, size, offset, ref_handle, ref_offset, event_handle, event_sync = _unpack(handle.handle)
            self.peer_buffer = None  # let go of the old one first
            self.peer_buffer = rebuild_cuda_tensor(
                torch.Tensor, torch.Size([size]), (1,), 0, torch.storage.TypedStorage, torch.uint8, index, ipc,
                size, offset, False, ref_handle, ref_offset, event_handle, event_sync)
            self.peer_key = key
        return self.peer_buffer

    def read(self, tensor: common_pb2.Tensor) -> torch.Tensor:
        """A copy of the tensor on this channel's device (its own memory: the peer may reuse its buffer)."""
        handle = tensor.handle
        if handle.transport != CUDA_IPC:
            raise ValueError(f"tensor handle transport {handle.transport} is not CUDA IPC")
        dtype = TORCH_DTYPES.get(tensor.dtype)
        if dtype is None:
            raise ValueError(f"unsupported tensor dtype {tensor.dtype!r}")
        shape = tuple(tensor.shape)
        count = 1
        for d in shape:
            if d < 0:
                raise ValueError(f"negative tensor dimension in {list(shape)}")
            count *= d
        nbytes = count * dtype.itemsize
        buffer = self._open(handle)
        if handle.offset % dtype.itemsize or handle.offset + nbytes > buffer.numel():
            raise ValueError(f"tensor {list(shape)} {tensor.dtype} at offset {handle.offset} is past its buffer")
        view = buffer[handle.offset:handle.offset + nbytes].view(dtype).view(shape)
        out = view.to(self.device, copy=True)
        torch.cuda.current_stream(buffer.device).synchronize()  # copied before the peer may reuse its buffer
        if out.device != buffer.device:
            torch.cuda.current_stream(self.device).synchronize()
        return out

    def close(self) -> None:
        """Drop this side's buffer and the peer's mapping (idempotent)."""
        self.peer_buffer, self.peer_key = None, None
        self.buffer, self.handle = None, b""
        torch.cuda.ipc_collect()  # free blocks whose readers have all let go
