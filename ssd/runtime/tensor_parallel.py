"""A tensor-parallel target: rank 0 in the engine's process, ranks 1..N-1 as worker processes, in lockstep.

Rank 0 owns everything but its shard of the model: scheduling, sampling, verification, speculation. Every
model call it makes (`forward`, `move_kv`) is first sent to the workers over a local socket, then run on its
own shard, so all ranks enter each forward's collectives together. Each rank holds 1/N of the attention
heads (and their KV cache), of the MLP width and of the vocabulary; the residual stream is whole on every
rank (all-reduced after each attention and MLP), so rank 0's logits and target features are complete.

Workers run `python -m ssd.runtime.tensor_parallel_worker` (a fresh interpreter: forking would copy the
engine's threads, and multiprocessing's spawn would re-run the caller's main module). Collectives go through
a shared memory mapping (ssd/runtime/shared_memory_collectives.py) where the tensor fits a slot, else over a gloo
process group made from a TCP store on 127.0.0.1. A worker exits when rank 0's connection closes, so an
engine that dies leaves no worker behind. Each rank pins itself to its share of the process's cores.
"""

import functools
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, Listener
from pathlib import Path

import structlog
import torch
import torch.distributed as dist

from ssd.config import EngineConfig
from ssd.context import ForwardMode
from ssd.distributed import TensorParallel
from ssd.errors import EngineDeadError, InvalidRequestError
from ssd.model_config import ModelConfig
from ssd.runtime.model_runner import ForwardItem, ForwardOutput, ModelRunner
from ssd.runtime.model_worker import ModelWorker
from ssd.runtime.shared_memory_collectives import SharedMemoryCollectives
from ssd.runtime.shared_memory_collectives import supported as shared_memory_collectives_supported

log = structlog.get_logger(__name__)

# How long a collective may wait for the other ranks. A rank that crashes closes its sockets, which fails the
# others' collectives at once; this bounds only a rank that hangs.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
START_TIMEOUT_S = 300.0  # worker start-up: interpreter, imports, loading its shard
ADDRESS_ENV, AUTHKEY_ENV = "SSD_TP_ADDRESS", "SSD_TP_AUTHKEY"


@dataclass(frozen=True)
class RankSetup:
    """What a worker needs to build its shard (sent to it over the control connection)."""

    path: Path
    config: EngineConfig
    num_threads: int
    cores: tuple[int, ...] | None  # CPU cores the rank is pinned to; None = not pinned
    shared_memory: Path | None  # the collectives' shared mapping (rank 0 made it); None = gloo only


def check_tensor_parallel(mc: ModelConfig, size: int) -> None:
    """Refuse, before any process starts, a size that does not divide the model's sharded dimensions."""
    dims = {"num_attention_heads": mc.num_attention_heads, "num_key_value_heads": mc.num_key_value_heads,
            "intermediate_size": mc.intermediate_size, "vocab_size": mc.vocab_size}
    bad = [f"{name} = {value}" for name, value in dims.items() if value % size]
    if bad:
        raise InvalidRequestError(f"tensor_parallel_size {size} does not divide this model's {', '.join(bad)}")


@functools.cache
def process_cores() -> tuple[int, ...]:
    """The cores this process could use before rank 0 pinned itself (read once, on the first start)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def rank_cores(size: int) -> list[tuple[int, ...]] | None:
    """The process's cores split evenly among `size` ranks; None when there are fewer than `size` (the ranks
    then share them, unpinned)."""
    cores = process_cores()
    per_rank = len(cores) // size
    if per_rank == 0:
        return None
    return [tuple(cores[r * per_rank : (r + 1) * per_rank]) for r in range(size)]


def pin(cores: tuple[int, ...] | None, num_threads: int) -> None:
    if cores is not None:
        os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(num_threads)


def make_group(setup: RankSetup, store_port: int, rank: int, size: int) -> TensorParallel:
    """Join the ranks' gloo group (blocks until all `size` ranks have joined) and map the shared memory."""
    parent = os.getppid()
    shared = None if setup.shared_memory is None else SharedMemoryCollectives(
        setup.shared_memory, rank, size, create=False, peers_alive=lambda: os.getppid() == parent,
        timeout_s=COLLECTIVE_TIMEOUT.total_seconds(), own_core=setup.cores is not None)
    store = dist.TCPStore("127.0.0.1", store_port, size, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    return TensorParallel(rank, size, dist.ProcessGroupGloo(store, rank, size, COLLECTIVE_TIMEOUT), shared)


def shared_memory_path() -> Path:
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return folder / f"ssd-tp-{os.getpid()}-{secrets.token_hex(8)}"


class TensorParallelWorkers:
    """Ranks 1..N-1: their processes and control connections."""

    def __init__(self, conns: list[Connection], procs: list[subprocess.Popen], caller_cores: set[int]) -> None:
        self.conns = conns
        self.procs = procs
        self._finalizer = weakref.finalize(self, _stop, conns, procs)
        self.caller_cores = caller_cores  # rank 0 pinned the calling thread; close() gives it these back

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise EngineDeadError(f"tensor-parallel rank {rank} exited with status {proc.returncode}")

    def send(self, message: tuple) -> None:
        self.check_alive()
        data = pickle.dumps(message)  # plain pickle: Connection.send would pass tensors as shared file descriptors
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as e:
            raise EngineDeadError(f"a tensor-parallel rank is unreachable: {e}") from e

    def close(self) -> None:
        self._finalizer()
        os.sched_setaffinity(0, self.caller_cores)


def _stop(conns: list[Connection], procs: list[subprocess.Popen]) -> None:
    for conn in conns:
        try:
            conn.send_bytes(pickle.dumps(("stop",)))
            conn.close()
        except OSError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class TensorParallelRunner:
    """Rank 0's runner: the same calls as `ModelRunner`, mirrored to the workers before each runs locally."""

    def __init__(self, local: ModelRunner, workers: TensorParallelWorkers) -> None:
        self.local = local
        self.workers = workers

    def forward(self, items: list[ForwardItem], mode: ForwardMode, aux_layers: tuple[int, ...] = ()) -> ForwardOutput:
        self.workers.send(("forward", items, mode, aux_layers))
        try:
            return self.local.forward(items, mode, aux_layers)
        except Exception as e:  # the ranks are out of step from here on: say which one went away, if one did
            time.sleep(0.1)  # a rank's exit status lands shortly after its sockets close
            self.workers.check_alive()
            raise EngineDeadError(f"a tensor-parallel forward failed on rank 0, the ranks are out of step: {e}") from e

    def move_kv(self, block_table: list[int], src: list[int], dst: list[int]) -> None:
        self.workers.send(("move_kv", block_table, src, dst))
        self.local.move_kv(block_table, src, dst)


def start_tensor_parallel(path: Path, mc: ModelConfig, config: EngineConfig) -> tuple[ModelWorker, TensorParallelWorkers]:
    """Start ranks 1..N-1, build rank 0's shard here; returns rank 0's worker with its runner mirrored."""
    size = config.tensor_parallel_size
    check_tensor_parallel(mc, size)
    cores = rank_cores(size)
    threads = config.num_threads or (len(cores[0]) if cores else max(1, (os.cpu_count() or 1) // size))
    use_shared = config.tensor_parallel_collectives == "auto" and shared_memory_collectives_supported()
    shm = shared_memory_path() if use_shared else None
    setups = [RankSetup(path, config, threads, cores[r] if cores else None, shm) for r in range(size)]
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False)
    workers = _launch(size - 1, caller_cores=os.sched_getaffinity(0))
    try:
        pin(setups[0].cores, threads)  # close() gives the calling thread its cores back
        shared = None if shm is None else SharedMemoryCollectives(
            shm, 0, size, create=True, peers_alive=lambda: all(p.poll() is None for p in workers.procs),
            timeout_s=COLLECTIVE_TIMEOUT.total_seconds(), own_core=cores is not None)
        for rank, conn in enumerate(workers.conns, start=1):
            conn.send_bytes(pickle.dumps((rank, size, store.port, setups[rank])))
        tp = TensorParallel(0, size, dist.ProcessGroupGloo(store, 0, size, COLLECTIVE_TIMEOUT), shared)
        worker = ModelWorker.for_engine(path, config, "cpu", tp)
        _await_ready(workers, worker.num_blocks)
    except BaseException:
        workers.close()
        raise
    finally:
        if shm is not None:
            shm.unlink(missing_ok=True)  # every rank has mapped it (or failed): the file is not needed again
    worker.runner = TensorParallelRunner(worker.runner, workers)  # type: ignore[assignment]
    log.info("tensor-parallel target ready", size=size, threads_per_rank=threads, kv_blocks=worker.num_blocks,
             cores=[list(c) for c in cores] if cores else "shared", collectives="shared memory" if shm else "gloo")
    return worker, workers


def _launch(num_workers: int, caller_cores: set[int]) -> TensorParallelWorkers:
    """Start the worker processes and accept their control connections."""
    authkey = secrets.token_bytes(32)
    with Listener(family="AF_UNIX", authkey=authkey) as listener:
        env = {**os.environ, ADDRESS_ENV: listener.address, AUTHKEY_ENV: authkey.hex()}
        procs = [subprocess.Popen([sys.executable, "-m", "ssd.runtime.tensor_parallel_worker"], env=env)
                 for _ in range(num_workers)]
        return TensorParallelWorkers(_accept(listener, procs), procs, caller_cores)


def _await_ready(workers: TensorParallelWorkers, num_blocks: int) -> None:
    for rank, conn in enumerate(workers.conns, start=1):
        try:
            reply = pickle.loads(conn.recv_bytes())
        except EOFError:
            reply = ("exited",)
        if reply[0] != "ready" or reply[1] != num_blocks:
            raise RuntimeError(f"tensor-parallel rank {rank} did not start: {reply}")


def _accept(listener: Listener, procs: list[subprocess.Popen]) -> list[Connection]:
    """The workers' connections, in order of arrival; a clear error if a worker exits or never calls."""
    conns: list[Connection] = []
    done = threading.Event()

    def accept_all() -> None:
        while len(conns) < len(procs):
            conns.append(listener.accept())
        done.set()

    threading.Thread(target=accept_all, daemon=True, name="tp-accept").start()
    deadline = START_TIMEOUT_S
    while not done.wait(0.2):
        deadline -= 0.2
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead or deadline <= 0:
            _stop(conns, procs)
            for p in procs:
                p.kill()
            reason = f"exited with status {dead[0]}" if dead else f"did not connect within {START_TIMEOUT_S:.0f} s"
            raise RuntimeError(f"a tensor-parallel worker {reason} (see its log above)")
    return conns
