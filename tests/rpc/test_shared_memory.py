"""Shared-memory tensors: negotiated per session, exact round trips, growth, and a segment lifecycle where
only the creator unlinks (never a reader, not even when the reader's process exits) and nothing leaks."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from protos.ssd.v1 import common_pb2
from rpc import shared_memory
from rpc.shared_memory import SHM_DIR
from rpc.tensors import SessionTensors
from tests.integration.helpers import wait_for

SHM = common_pb2.TENSOR_TRANSPORT_SHARED_MEMORY
INLINE = common_pb2.TENSOR_TRANSPORT_INLINE

pytestmark = pytest.mark.skipif(not shared_memory.is_available(), reason="no /dev/shm")


def segment_name(side: SessionTensors) -> str:
    return side._writer.segment.name


@pytest.fixture
def pair():
    """(target side, draft side) of one session that agreed on shared memory."""
    target, draft = SessionTensors(), SessionTensors()
    transports, probe, cuda_probe = target.offer()
    assert transports[0] == SHM and probe.WhichOneof("data") == "handle" and cuda_probe is None
    assert target.settle(draft.accept(transports, probe)) == SHM
    yield target, draft
    target.close()
    draft.close()


def test_round_trips_through_shared_memory_both_ways(pair):
    target, draft = pair
    features = (torch.randn(7, 48) * 30).to(torch.bfloat16)  # [n, F]
    target.start_message(features.numel() * 2)
    msg = common_pb2.Tensor.FromString(target.encode(features.view(torch.int16).numpy(), "bfloat16")
                                       .SerializeToString())
    assert msg.WhichOneof("data") == "handle" and msg.handle.transport == SHM
    assert torch.equal(torch.from_numpy(draft.decode(msg)).view(torch.bfloat16), features)
    q = np.random.default_rng(0).random((3, 96), dtype=np.float32)  # [n, V]
    draft.start_message(q.nbytes)
    back = draft.encode(q)
    assert back.WhichOneof("data") == "handle" and np.array_equal(target.decode(back), q)


def test_a_bigger_message_moves_to_a_bigger_segment_and_unlinks_the_old(pair):
    target, draft = pair
    old = segment_name(target)
    big = np.arange(3 * 2**20 // 4 * 4, dtype=np.float32).reshape(-1, 4)  # 12 MiB > the first segment
    target.start_message(big.nbytes)
    msg = target.encode(big)
    assert msg.WhichOneof("data") == "handle" and msg.handle.handle.decode() != old
    assert not (SHM_DIR / old).exists()
    assert np.array_equal(draft.decode(msg), big)
    target.start_message(16)  # the next message reuses the segment from offset 0
    assert target.encode(np.ones(4, np.float32)).handle.offset == 0


def test_close_unlinks_only_own_segments_and_is_idempotent():
    target, draft = SessionTensors(), SessionTensors()
    transports, probe, _ = target.offer()
    target.settle(draft.accept(transports, probe))
    mine, theirs = segment_name(target), segment_name(draft)
    draft.close()  # the draft unlinks its own segment, never the target's it has mapped
    assert (SHM_DIR / mine).exists() and not (SHM_DIR / theirs).exists()
    draft.close()
    target.close()
    assert not (SHM_DIR / mine).exists()


def test_a_reader_process_exiting_leaves_the_segment_alone(pair):
    target, _ = pair
    target.start_message(16)
    msg = target.encode(np.array([1.5, 2.5], np.float32))
    code = textwrap.dedent(f"""
        from protos.ssd.v1 import common_pb2
        from rpc.tensors import SessionTensors
        reader = SessionTensors()
        print(reader.decode(common_pb2.Tensor.FromString(bytes.fromhex({msg.SerializeToString().hex()!r}))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "[1.5 2.5]" in out.stdout
    assert (SHM_DIR / segment_name(target)).exists()


def test_a_killed_writer_leaks_nothing():
    code = textwrap.dedent("""
        import sys, time
        from rpc.tensors import SessionTensors
        side = SessionTensors()
        side.offer()
        print(side._writer.segment.name, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert (SHM_DIR / name).exists()
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not (SHM_DIR / name).exists(), timeout_s=20)  # its resource tracker unlinks it


def test_another_node_or_a_foreign_name_falls_back_to_inline():
    draft = SessionTensors()
    for name in (b"ssd-0123456789abcdef", b"../../etc/passwd"):  # absent here (another node); not ours
        probe = common_pb2.Tensor(dtype="int64", shape=[1], handle=common_pb2.TensorHandle(
            transport=SHM, handle=name))
        assert draft.accept([SHM, INLINE], probe) == INLINE
    assert draft.encode(np.zeros(2, np.float32)).WhichOneof("data") == "inline_bytes"
    target = SessionTensors()
    assert target.offer(enabled=False) == ([INLINE], None, None)
    draft.close()
    target.close()
