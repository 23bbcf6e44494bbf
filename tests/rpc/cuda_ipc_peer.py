"""The draft side of a CUDA IPC session, in its own process (a handle cannot be opened by its own process).

Reads one command per stdin line and answers one line on stdout:
  accept <transports,comma-separated> <cuda probe, hex proto>  -> the transport it settled on
  read <tensor, hex proto>                                       -> the tensor back as an inline tensor (hex)
  checksum <tensor, hex proto>                                   -> "<shape> <dtype> <float64 sum on the host>"
  send <rows> <cols>                                             -> a [rows, cols] float32 GPU tensor i*cols+j, encoded
Errors answer "error <ValueError text>"; the process keeps going.
"""

import sys

import torch

from protos.ssd.v1 import common_pb2
from rpc.tensors import to_tensor
from tensor_transport import torch_tensors


def _tensor(hex_text: str) -> common_pb2.Tensor:
    return common_pb2.Tensor.FromString(bytes.fromhex(hex_text))


def answer(tensors, words: list[str]) -> str:  # noqa: ANN001 - SessionTensors
    device = torch.device("cuda")
    if words[0] == "accept":
        transports = [int(t) for t in words[1].split(",")]
        return str(tensors.accept(transports, None, _tensor(words[2])))
    if words[0] == "read":
        array, dtype = torch_tensors.host_array(torch_tensors.decode(tensors, _tensor(words[1]), device))
        return to_tensor(array, dtype).SerializeToString().hex()
    if words[0] == "checksum":
        t = torch_tensors.decode(tensors, _tensor(words[1]), device)
        return f"{list(t.shape)} {t.dtype} {t.device.type} {t.cpu().double().sum().item()!r}"
    if words[0] == "send":
        rows, cols = int(words[1]), int(words[2])
        t = torch.arange(rows * cols, dtype=torch.float32, device=device).view(rows, cols)
        tensors.start_message(t.numel() * 4)
        return torch_tensors.encode(tensors, t).SerializeToString().hex()
    return f"error unknown command {words[0]}"


def main() -> None:
    tensors = torch_tensors.session_tensors(torch.device("cuda"))
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            reply = answer(tensors, words)
        except ValueError as e:
            reply = "error " + str(e).replace("\n", " ")
        print(reply, flush=True)
    tensors.close()


if __name__ == "__main__":
    main()
