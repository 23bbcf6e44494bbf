"""Kernel tests: compiled kernels on a GPU where there is one, else Triton's CPU interpreter.

tests/conftest.py sets TRITON_INTERPRET=1 on machines without CUDA before anything imports triton.
"""

import os

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run")
    return torch.device("cpu")
