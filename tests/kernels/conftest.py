"""Kernel tests: compiled kernels on a GPU where there is one, else Triton's CPU interpreter.

tests/conftest.py sets TRITON_INTERPRET=1 on machines without CUDA before anything imports triton.
"""

import os

import pytest
import torch

from ssd.paths import cache_root
from ssd_kernels.cpu import extension as own_ext


@pytest.fixture(scope="session")
def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run")
    return torch.device("cpu")


@pytest.fixture(scope="module")
def ext():
    """The project's C++ CPU kernels, built once (cached under the project's cache folder, like the engine's)."""
    try:
        return own_ext.load_extension(cache_root() / "kernels")
    except own_ext.KernelBuildError as e:
        pytest.fail(f"the CPU kernels do not build here: {e}")
