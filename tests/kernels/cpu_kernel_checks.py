"""What the C++ CPU kernels' tests share: a path this CPU may lack, the error measure, and the check that a row gets
the same bits whatever the batch or threads (the built extension is the `ext` fixture of tests/kernels/conftest.py)."""

from collections.abc import Callable

import pytest
import torch

from ssd_kernels.cpu import extension as own_ext


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b|."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def require_path(ext, paths: dict[str, int], name: str) -> int:  # noqa: ANN001 - the extension module
    """The path `name` of `paths`, or a skip where this CPU does not run it."""
    path = paths[name]
    if path not in own_ext.supported_paths(ext):
        pytest.skip(f"this CPU does not run the {name} path")
    return path


def assert_rows_invariant(gemm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """gemm(x) gives each row of x [M, K] the same bits as gemm of that row alone, and on two threads as on one."""
    batch = gemm(x)
    alone = torch.cat([gemm(x[i : i + 1]) for i in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = gemm(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch, alone) and torch.equal(batch, two)
