"""How a session settles on CUDA IPC, shared memory or inline when a side has a GPU channel.

The channel here is an in-process stand-in (rpc/cuda_ipc.py needs a GPU and two processes: its own
tests are tests/rpc/test_cuda_ipc.py); what is checked is SessionTensors' negotiation and routing.
"""

import secrets

import pytest
import torch

from protos.ssd.v1 import common_pb2
from rpc import shared_memory
from rpc.tensors import CUDA_IPC, INLINE, SHARED_MEMORY, SessionTensors
from tensor_transport import torch_tensors

pytestmark = pytest.mark.skipif(not shared_memory.is_available(), reason="no /dev/shm")

_STORE: dict[bytes, torch.Tensor] = {}  # what the stand-in channels "shared", by handle


class StandInChannel:
    """A DeviceChannel that keeps tensors in this process; `visible=False` plays a GPU the reader cannot see."""

    def __init__(self, visible: bool = True, probe_fails: bool = False) -> None:
        self.visible, self.probe_fails, self.closed = visible, probe_fails, False

    def probe(self) -> common_pb2.Tensor | None:
        if self.probe_fails:
            raise RuntimeError("CUDA error: out of memory")
        return self.put(torch.tensor([7]))

    def start_message(self, num_bytes: int) -> None:
        pass

    def put(self, tensor: torch.Tensor) -> common_pb2.Tensor:
        key = secrets.token_bytes(8)
        _STORE[key] = tensor.clone()
        handle = common_pb2.TensorHandle(transport=CUDA_IPC, handle=key, device_uuid="GPU-standin", epoch=1)
        return common_pb2.Tensor(dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape),
                                 handle=handle)

    def read(self, tensor: common_pb2.Tensor) -> torch.Tensor:
        if not self.visible:
            raise ValueError("CUDA device GPU-standin is not visible to this process")
        return _STORE[tensor.handle.handle].clone()

    def close(self) -> None:
        self.closed = True


def settled(target: SessionTensors, draft: SessionTensors) -> int:
    offer = target.offer()
    return target.settle(draft.accept(offer.transports, offer.shm_probe, offer.cuda_probe))


def test_both_sides_on_one_gpu_settle_on_cuda_ipc_and_host_tensors_keep_shared_memory():
    target, draft = SessionTensors(StandInChannel()), SessionTensors(StandInChannel())
    offer = target.offer()
    assert offer.transports == [CUDA_IPC, SHARED_MEMORY, INLINE] and offer.cuda_probe.handle.transport == CUDA_IPC
    assert target.settle(draft.accept(offer.transports, offer.shm_probe, offer.cuda_probe)) == CUDA_IPC
    features = torch.randn(5, 12)  # [n, F]: a "GPU" tensor for the stand-in
    msg = target.encode_device(features)
    assert msg.handle.transport == CUDA_IPC and torch.equal(draft.decode_device(msg), features)
    q = torch.rand(3, 40)  # [n, V] host tensor from the draft: its shared memory, beside CUDA IPC
    draft.start_message(q.numel() * 4)
    back = torch_tensors.encode(draft, q)
    assert back.handle.transport == SHARED_MEMORY
    assert torch.equal(torch_tensors.decode(target, back, torch.device("cpu")), q)
    target.close()
    draft.close()


def test_a_gpu_the_draft_cannot_see_falls_back_to_shared_memory():
    draft_channel = StandInChannel(visible=False)
    target, draft = SessionTensors(StandInChannel()), SessionTensors(draft_channel)
    assert settled(target, draft) == SHARED_MEMORY
    assert draft_channel.closed and draft.encode_device(torch.ones(2)) is None
    assert target.encode_device(torch.ones(2)) is None  # the target dropped its channel too
    target.close()
    draft.close()


def test_a_draft_without_a_gpu_channel_refuses_cuda_handles_clearly():
    target, draft = SessionTensors(StandInChannel()), SessionTensors()
    assert settled(target, draft) == SHARED_MEMORY
    handle = StandInChannel().put(torch.ones(2))
    with pytest.raises(ValueError, match="no CUDA IPC channel"):
        torch_tensors.decode(draft, handle, torch.device("cpu"))
    with pytest.raises(ValueError, match="decode_device"):
        draft.decode(handle)
    target.close()
    draft.close()


def test_a_failing_probe_or_a_disabled_offer_leaves_cuda_ipc_out():
    failing = SessionTensors(StandInChannel(probe_fails=True))
    assert failing.offer().transports == [SHARED_MEMORY, INLINE]
    assert SessionTensors(StandInChannel()).offer(enabled=False) == ([INLINE], None, None)
    failing.close()


def test_close_drops_the_gpu_channel():
    channel = StandInChannel()
    side = SessionTensors(channel)
    side.close()
    side.close()
    assert channel.closed
