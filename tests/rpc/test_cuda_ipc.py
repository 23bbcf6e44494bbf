"""CUDA IPC tensors between two real processes on one GPU: negotiated by probe, exact both ways, a bigger
message moves to a bigger buffer, stale or foreign handles are refused with a clear error.

Needs a CUDA GPU (skipped elsewhere); the peer is tests/rpc/cuda_ipc_peer.py in its own process, since a
process cannot open its own IPC handles.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from protos.ssd.v1 import common_pb2
from rpc.tensors import CUDA_IPC, SessionTensors
from tensor_transport import torch_tensors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


def hexed(msg: common_pb2.Tensor) -> str:
    return msg.SerializeToString().hex()


@pytest.fixture
def session():
    """(target side here, ask(...) the draft side in another process), settled on CUDA IPC."""
    target = torch_tensors.session_tensors(CUDA)
    peer = subprocess.Popen([sys.executable, "-m", "tests.rpc.cuda_ipc_peer"], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(*words: str) -> str:
        peer.stdin.write(" ".join(words) + "\n")
        peer.stdin.flush()
        return peer.stdout.readline().strip()

    offer = target.offer()
    transport = ask("accept", ",".join(map(str, offer.transports)), hexed(offer.cuda_probe))
    assert int(transport) == target.settle(int(transport)) == CUDA_IPC
    yield target, ask
    target.close()  # lets go of the peer's buffer before the peer exits (torch warns a producer otherwise)
    ask("quit")
    peer.wait(timeout=60)


def test_the_offer_leads_with_cuda_ipc_and_a_probe_on_this_gpu():
    from tensor_transport.cuda_ipc import device_uuid

    side = torch_tensors.session_tensors(CUDA)
    offer = side.offer()
    assert offer.transports[0] == CUDA_IPC
    handle = offer.cuda_probe.handle
    assert handle.transport == CUDA_IPC and handle.device_uuid == device_uuid(CUDA) and handle.epoch > 0
    side.close()


def test_tensors_cross_by_handle_exactly(session):
    target, ask = session
    features = (torch.randn(7, 48, device=CUDA) * 30).to(torch.bfloat16)  # [n, F]
    q = torch.randn(3, 96, device=CUDA)  # [n, V]
    target.start_message(torch_tensors.wire_bytes(features) + torch_tensors.wire_bytes(q))
    for tensor in (features, q):
        msg = torch_tensors.encode(target, tensor)
        assert msg.WhichOneof("data") == "handle" and msg.handle.transport == CUDA_IPC
        back = common_pb2.Tensor.FromString(bytes.fromhex(ask("read", hexed(msg))))  # inline, from the peer
        assert torch.equal(torch_tensors.decode(SessionTensors(), back, CPU), tensor.cpu())


def test_the_draft_side_sends_gpu_tensors_back_by_handle(session):
    target, ask = session
    msg = common_pb2.Tensor.FromString(bytes.fromhex(ask("send", "5", "33")))
    assert msg.handle.transport == CUDA_IPC
    got = torch_tensors.decode(target, msg, CUDA)
    assert got.is_cuda and torch.equal(got.cpu(), torch.arange(165, dtype=torch.float32).view(5, 33))


def test_a_bigger_message_moves_to_a_bigger_buffer(session):
    target, ask = session
    first = target._device.handle
    big = torch.arange(3 * 2**20, dtype=torch.float32, device=CUDA).view(-1, 4)  # 12 MiB > the first buffer
    target.start_message(big.numel() * 4)
    msg = torch_tensors.encode(target, big)
    assert msg.handle.handle != first
    assert ask("checksum", hexed(msg)) == f"{list(big.shape)} torch.float32 cuda {big.cpu().double().sum().item()!r}"
    target.start_message(16)  # the next message reuses the buffer from offset 0
    small = torch_tensors.encode(target, torch.ones(4, device=CUDA))
    assert small.handle.offset == 0 and ask("checksum", hexed(small)) == "[4] torch.float32 cuda 4.0"


def test_stale_epochs_and_unseen_gpus_are_refused_and_the_session_goes_on(session):
    target, ask = session
    target.start_message(16)
    msg = torch_tensors.encode(target, torch.ones(4, device=CUDA))
    stale = common_pb2.Tensor()
    stale.CopyFrom(msg)
    stale.handle.epoch += 1
    assert ask("checksum", hexed(stale)).startswith("error") and "stale" in ask("checksum", hexed(stale))
    foreign = common_pb2.Tensor()
    foreign.CopyFrom(msg)
    foreign.handle.device_uuid = "GPU-00000000-0000-0000-0000-000000000000"
    assert "not visible" in ask("checksum", hexed(foreign))
    past = common_pb2.Tensor()
    past.CopyFrom(msg)
    past.handle.offset = 1 << 40
    assert "past its buffer" in ask("checksum", hexed(past))
    assert ask("checksum", hexed(msg)) == "[4] torch.float32 cuda 4.0"


def test_cpu_tensors_on_a_cuda_session_go_as_host_bytes(session):
    target, ask = session
    host = torch.arange(6, dtype=torch.float32)
    msg = torch_tensors.encode(target, host)
    assert msg.WhichOneof("data") == "inline_bytes"  # the target dropped its shared memory for CUDA IPC
    assert ask("checksum", hexed(msg)) == "[6] torch.float32 cuda 15.0"
