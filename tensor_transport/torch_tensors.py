"""torch tensors over a session: GPU tensors by CUDA IPC when the session agreed to it, anything else as a
host array (inline or shared memory, rpc/tensors.py). The model services' one entry point for tensors.

Imports torch, like tensor_transport/cuda_ipc.py; the gateway never imports either (import contracts).
"""

import numpy as np
import torch

from protos.ssd.v1 import common_pb2
from rpc.tensors import CUDA_IPC, SessionTensors

_HOST_DTYPES = (torch.float32, torch.float16, torch.int32, torch.int64)  # numpy has these; bf16 goes as bits


def session_tensors(device: torch.device | None, enable_cuda_ipc: bool = True) -> SessionTensors:
    """A session's tensors for a service whose model lives on `device`: with a CUDA IPC channel on a GPU."""
    if device is None or device.type != "cuda" or not enable_cuda_ipc:
        return SessionTensors()
    from tensor_transport.cuda_ipc import CudaIpcChannel  # only where a GPU is in use

    return SessionTensors(CudaIpcChannel(device))


def host_array(tensor: torch.Tensor) -> tuple[np.ndarray, str]:
    """(elements on the host, wire dtype): bfloat16 as its bit patterns, other unsupported dtypes as float32."""
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    if t.dtype not in _HOST_DTYPES:
        t = t.float()
    return t.numpy(), str(t.dtype).removeprefix("torch.")


def wire_bytes(tensor: torch.Tensor) -> int:
    """Bytes `encode` needs for `tensor` (for `SessionTensors.start_message`)."""
    itemsize = tensor.element_size() if tensor.dtype in (*_HOST_DTYPES, torch.bfloat16) else 4
    return tensor.numel() * itemsize


def encode(tensors: SessionTensors, tensor: torch.Tensor) -> common_pb2.Tensor:
    """`tensor` for the wire: by CUDA IPC if it is on the session's GPU and there is room, else as host bytes."""
    if tensor.is_cuda:
        message = tensors.encode_device(tensor.detach().contiguous())
        if message is not None:
            return message
    array, dtype = host_array(tensor)
    return tensors.encode(array, dtype)


def decode(tensors: SessionTensors, message: common_pb2.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor off the wire, on `device`, in its wire dtype (bfloat16 restored from its bit patterns)."""
    if message.WhichOneof("data") == "handle" and message.handle.transport == CUDA_IPC:
        return tensors.decode_device(message).to(device)
    tensor = torch.from_numpy(tensors.decode(message))
    if message.dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.to(device)
