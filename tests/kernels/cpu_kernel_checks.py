"""What the C++ CPU kernels' tests share: a path this CPU may lack, and the error measure (the built extension is
the `ext` fixture of tests/kernels/conftest.py)."""

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
