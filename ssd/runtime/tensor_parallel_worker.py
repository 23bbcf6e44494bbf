"""A tensor-parallel worker process (rank >= 1): builds its shard, then runs rank 0's model calls as they come.

Started by `ssd.runtime.tensor_parallel.start_tensor_parallel`, never by hand. It reads rank 0's socket address
and key from the environment, receives its rank and what to load, joins the ranks' gloo group, and replays
every `forward` / `move_kv` rank 0 sends; the results stay here (rank 0's own shard gives the whole logits).
It exits on "stop" or when rank 0's connection closes.
"""

import os
import pickle
import sys
from multiprocessing.connection import Client

import structlog
import torch

from ssd.log_setup import configure_logging
from ssd.runtime.model_worker import ModelWorker
from ssd.runtime.tensor_parallel import ADDRESS_ENV, AUTHKEY_ENV, RankSetup, make_group, pin

log = structlog.get_logger(__name__)


def serve(conn, worker: ModelWorker) -> None:  # type: ignore[no-untyped-def]
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:  # rank 0 is gone
            return
        op, args = message[0], message[1:]
        if op == "forward":
            worker.runner.forward(*args)
        elif op == "move_kv":
            worker.runner.move_kv(*args)
        elif op == "stop":
            return
        else:
            raise RuntimeError(f"unknown tensor-parallel message {op!r}")


def main() -> int:
    configure_logging()
    if ADDRESS_ENV not in os.environ or AUTHKEY_ENV not in os.environ:
        sys.stderr.write("ssd.runtime.tensor_parallel_worker is started by a tensor-parallel engine, not by hand "
                         "(use --tensor-parallel-size)\n")
        return 2
    conn = Client(os.environ[ADDRESS_ENV], family="AF_UNIX", authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    rank, size, store_port, setup = pickle.loads(conn.recv_bytes())
    if not isinstance(setup, RankSetup):
        raise RuntimeError(f"expected a RankSetup from rank 0, got {type(setup).__name__}")
    pin(setup.cores, setup.num_threads)
    structlog.contextvars.bind_contextvars(tp_rank=rank)
    tp = make_group(setup, store_port, rank, size)
    worker = ModelWorker.for_engine(setup.path, setup.config, "cpu", tp)
    conn.send_bytes(pickle.dumps(("ready", worker.num_blocks)))
    log.info("tensor-parallel rank ready", rank=rank, size=size, load_s=round(worker.load_s, 2))
    with torch.inference_mode():
        serve(conn, worker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
