"""Same-node tensor bytes: one POSIX shared-memory segment per writer and session, reused per message.

Lifecycle. Only the creator ever unlinks a segment: at session end, when it replaces it by a bigger
one, or, if its process dies, through Python's resource tracker. Readers map it read-only straight
from /dev/shm (never through SharedMemory, which on Python < 3.13 would register the segment with the
reader's tracker and unlink it when the reader exits), copy the tensor out and never unlink.
Reuse. Each message's tensors start again at offset 0: a session has one message in flight per
direction, and the reader copies a message's tensors before it answers, which is what lets the
writer send its next one.
"""

import mmap
import os
import re
import secrets
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import structlog

from protos.ssd.v1 import common_pb2

log = structlog.get_logger(__name__)

SHM_DIR = Path("/dev/shm")  # where Linux keeps POSIX shared memory; no directory = no shared-memory transport
_NAME = re.compile(r"ssd-[0-9a-f]{16}")  # our writers' names; readers refuse any other path
_ALIGN = 64  # tensor offsets are cache-line aligned
MIN_SEGMENT_BYTES = 1 << 20
MAX_SEGMENT_BYTES = 1 << 30  # a message that needs more goes inline


def live_segments() -> set[str]:
    """Names of this transport's segments that exist now, anyone's (not the tensor-parallel ranks' `ssd-tp-`)."""
    return {p.name for p in SHM_DIR.glob("ssd-*") if _NAME.fullmatch(p.name)} if SHM_DIR.is_dir() else set()


def is_available() -> bool:
    return SHM_DIR.is_dir()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _create(size: int) -> shared_memory.SharedMemory | None:
    """A new segment with all its pages reserved (so a full /dev/shm fails here, not as SIGBUS on a write)."""
    try:
        segment = shared_memory.SharedMemory(name=f"ssd-{secrets.token_hex(8)}", create=True, size=size)
    except OSError as e:
        log.warning("no shared-memory segment; tensors go inline", size=size, error=str(e))
        return None
    fd = getattr(segment, "_fd", -1)  # SharedMemory keeps its descriptor open on POSIX
    if fd >= 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            log.warning("shared memory is full; tensors go inline", size=size, error=str(e))
            segment.close()
            segment.unlink()
            return None
    return segment


class SegmentWriter:
    """This side's segment of one session: tensors of the current message at increasing offsets."""

    def __init__(self) -> None:
        self.segment: shared_memory.SharedMemory | None = _create(MIN_SEGMENT_BYTES)
        self.offset = 0  # next free byte of the current message

    def start_message(self, num_bytes: int) -> None:
        """Reuse the segment from offset 0; grow it first when the message's tensors need more room."""
        self.offset = 0
        need = _aligned(num_bytes) + _ALIGN * 64  # slack for per-tensor alignment
        if self.segment is None or self.segment.size >= need or need > MAX_SEGMENT_BYTES:
            return
        bigger = _create(min(MAX_SEGMENT_BYTES, max(need, 2 * self.segment.size)))
        if bigger is not None:  # the reader's mapping of the old one stays valid until it moves on
            self._drop()
            self.segment = bigger

    def put(self, data: np.ndarray, dtype: str) -> common_pb2.Tensor | None:
        """`data` (contiguous, little-endian) into the segment; None when it does not fit (send it inline)."""
        segment = self.segment
        if segment is None or self.offset + data.nbytes > segment.size:
            return None
        start = self.offset
        np.ndarray(data.shape, data.dtype, buffer=segment.buf, offset=start)[...] = data
        self.offset = _aligned(start + data.nbytes)
        handle = common_pb2.TensorHandle(transport=common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY,
                                         handle=segment.name.lstrip("/").encode(), offset=start)
        return common_pb2.Tensor(dtype=dtype, shape=list(data.shape), handle=handle)

    def _drop(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
            self.segment = None

    def close(self) -> None:
        self._drop()


class SegmentReader:
    """Read-only maps of the peer's segment (the latest one only: the peer unlinked any older one)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.map: mmap.mmap | None = None

    def _map(self, name: str) -> mmap.mmap:
        if name != self.name or self.map is None:
            if not _NAME.fullmatch(name):
                raise ValueError(f"not a shared-memory tensor segment of this project: {name!r}")
            self.close()
            try:
                fd = os.open(SHM_DIR / name, os.O_RDONLY)
            except OSError as e:  # FileNotFoundError: the writer is on another node, or gone
                raise ValueError(f"shared-memory segment {name} cannot be opened: {e}") from e
            try:
                self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            self.name = name
        return self.map

    def read(self, tensor: common_pb2.Tensor, dtype: np.dtype) -> np.ndarray:
        """A copy of the tensor's elements out of the peer's segment."""
        handle = tensor.handle
        if handle.transport != common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY:
            raise ValueError(f"tensor handle transport {handle.transport} is not shared memory")
        segment = self._map(handle.handle.decode(errors="replace"))
        shape = tuple(tensor.shape)
        count = int(np.prod(shape, dtype=np.int64))
        if any(d < 0 for d in shape) or handle.offset + count * dtype.itemsize > len(segment):
            raise ValueError(f"tensor {list(shape)} {tensor.dtype} at offset {handle.offset} is past its segment")
        view = np.frombuffer(segment, dtype=dtype, count=count, offset=handle.offset)
        out = view.reshape(shape).copy()
        del view  # the map can only be closed once no array points into it
        return out

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        self.map, self.name = None, None
