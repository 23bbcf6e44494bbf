"""Target features from one GPU process to another: inline bytes vs CUDA IPC handles, per message.

`python -m bench.tensor_transport --out FILE.json` (needs a CUDA GPU). The parent plays the target: it
encodes a [rows, 3*d] bfloat16 feature tensor living on the GPU the way a session does (rpc/torch_tensors)
and writes the serialized ssd.v1.Tensor to a peer process (the draft) over a pipe, length-prefixed; the peer
decodes it onto its GPU and answers one byte. The time is the whole round trip, median of many; the pipe
stands in for the gRPC stream, whose own cost (the same bytes again for inline) is left out.
"""

import argparse
import json
import statistics
import struct
import subprocess
import sys
import time

import torch

from protos.ssd.v1 import common_pb2
from tensor_transport import torch_tensors

WIDTHS = {"smollm2-135m": 3 * 576, "llama-3.1-8b": 3 * 4096, "llama-3.1-70b": 3 * 8192}  # 3 feature layers x d
ROWS = (5, 64, 320)  # one sequence's round (K+1), 16 x 4, 64 x 5


def _read_message(stream) -> bytes:  # noqa: ANN001 - a binary pipe
    header = stream.read(4)
    return stream.read(struct.unpack("<I", header)[0]) if len(header) == 4 else b""


def peer() -> None:
    """The draft side: settle on what the first message offers, then decode every tensor onto the GPU."""
    tensors = torch_tensors.session_tensors(torch.device("cuda"))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    hello = common_pb2.Tensor.FromString(_read_message(stdin))  # the CUDA probe, or an inline tensor
    is_cuda = hello.WhichOneof("data") == "handle"
    tensors.accept([common_pb2.TENSOR_TRANSPORT_CUDA_IPC] if is_cuda else [], None, hello if is_cuda else None)
    stdout.write(b"r")
    stdout.flush()
    while data := _read_message(stdin):
        torch_tensors.decode(tensors, common_pb2.Tensor.FromString(data), torch.device("cuda"))
        stdout.write(b"k")
        stdout.flush()
    tensors.close()


def measure(transport: str, width: int, rows: int, repeats: int) -> float:
    """Median ms per message for [rows, width] bf16 features by `transport` ("inline" | "cuda_ipc")."""
    tensors = torch_tensors.session_tensors(torch.device("cuda"), enable_cuda_ipc=transport == "cuda_ipc")
    proc = subprocess.Popen([sys.executable, "-m", "bench.tensor_transport", "--peer"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(msg: common_pb2.Tensor) -> bytes:
        data = msg.SerializeToString()
        proc.stdin.write(struct.pack("<I", len(data)) + data)
        proc.stdin.flush()
        return proc.stdout.read(1)

    offer = tensors.offer(enabled=transport == "cuda_ipc")
    send(offer.cuda_probe or common_pb2.Tensor(dtype="int64", shape=[0], inline_bytes=b""))
    tensors.settle(common_pb2.TENSOR_TRANSPORT_CUDA_IPC if offer.cuda_probe else common_pb2.TENSOR_TRANSPORT_INLINE)
    features = torch.randn(rows, width, device="cuda").to(torch.bfloat16)  # [rows, 3*d]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        tensors.start_message(torch_tensors.wire_bytes(features))
        send(torch_tensors.encode(tensors, features))
        times.append((time.perf_counter() - started) * 1e3)
    tensors.close()
    proc.stdin.close()
    proc.wait(timeout=60)
    return statistics.median(times[repeats // 5:])  # the first fifth warms up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.peer:
        return peer()
    results = []
    for model, width in WIDTHS.items():
        for rows in ROWS:
            row = {"model": model, "rows": rows, "bytes": rows * width * 2}
            for transport in ("inline", "cuda_ipc"):
                row[f"{transport}_ms"] = round(measure(transport, width, rows, args.repeats), 3)
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
