"""A draft service in its own process for `ssd bench --mode ssd`, as deployed: its own core on CPU.

Started with the bench's draft, model and dtype on a free localhost port, pinned to `core` (one torch
thread), waited for until it answers GetInfo, and stopped (SIGTERM, then SIGKILL) when the bench is done.
Its logs go to a file next to nothing else: `log_path`.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from rpc.ports import free_port
from ssd.errors import InvalidRequestError


class DraftProcess:
    def __init__(self, draft: str, target_model: str, dtype: str, core: int | None,
                 startup_timeout_s: float = 120.0, extra_args: list[str] | None = None) -> None:
        """`extra_args`: more draft_service flags (e.g. its SSD defaults that a Round does not carry)."""
        self.address = f"127.0.0.1:{free_port()}"
        self.log_path = Path(tempfile.mkstemp(prefix="ssd-bench-draft-", suffix=".log")[1])
        cmd = [sys.executable, "-m", "draft_service", "--draft", draft, "--target-model", target_model,
               "--dtype", dtype, "--threads", "1", "--address", self.address, "--log-level", "warning",
               "--log-text", *(extra_args or [])]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with self.log_path.open("w") as log:  # no preexec_fn: Python code between fork and exec, while this
            # process's gRPC threads hold their locks, aborted the child (`ssd bench --interleave` opens a draft
            # session per mode before it starts the next draft); the parent pins the new process instead
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        if core is not None:
            os.sched_setaffinity(self.proc.pid, {core})
        self.info = self._wait(startup_timeout_s)

    def _wait(self, timeout_s: float) -> draft_pb2.DraftInfo:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise InvalidRequestError(f"the draft service exited ({self.proc.returncode}): "
                                          f"{self.log_path.read_text()[-2000:]}")
            try:
                with grpc.insecure_channel(self.address) as ch:
                    return draft_pb2_grpc.SpeculatorStub(ch).GetInfo(draft_pb2.DraftInfoRequest(), timeout=2)
            except grpc.RpcError:
                time.sleep(0.3)
        self.close()
        raise InvalidRequestError(f"the draft service did not come up within {timeout_s:.0f} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
