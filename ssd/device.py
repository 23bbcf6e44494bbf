"""The device the model forward runs on: "cpu", "cuda" or "cuda:N", checked when an engine or a draft is built.

Only the forward lives there (weights, KV cache, hidden states, target features). The model runner hands
logits back as float32 CPU tensors, so sampling, verification and the proposers' token logic run on CPU,
with each request's CPU `torch.Generator`: a seeded request draws the same tokens on any device.
"""

import re

import torch

from ssd.errors import InvalidRequestError

DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")  # the device names configs accept


def resolve_device(name: str | torch.device) -> torch.device:
    """`name` as a concrete device (cuda -> cuda:<current>), or InvalidRequestError when it is not usable here."""
    text = str(name)
    if not DEVICE_PATTERN.fullmatch(text):
        raise InvalidRequestError(f"unknown device {text!r}; use 'cpu', 'cuda' or 'cuda:N'")
    if text == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidRequestError(
            f"device {text!r} was asked for but torch sees no CUDA GPU here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use device='cpu'"
        )
    count = torch.cuda.device_count()
    index = torch.device(text).index
    index = torch.cuda.current_device() if index is None else index
    if index >= count:
        raise InvalidRequestError(f"device {text!r} does not exist: torch sees {count} CUDA GPU(s), "
                                  f"cuda:0..cuda:{count - 1}")
    return torch.device("cuda", index)
