"""Tolerances of a kernel against its float32-computing reference, by dtype (about one ulp of the output)."""

import torch

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def differs(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """True when `actual` is outside the tolerance of `expected` somewhere."""
    tol = TOLERANCE[expected.dtype]
    return not torch.allclose(actual.float(), expected.float(), atol=tol, rtol=tol)


def assert_rounded_like(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bitwise equal, but for bf16 in Triton's CPU interpreter, which truncates float32 -> bf16 casts (a GPU
    rounds to nearest even, like torch): there one ulp apart is allowed."""
    if expected.dtype == torch.bfloat16 and actual.device.type == "cpu":
        assert_close(actual, expected)
    else:
        assert torch.equal(actual, expected)
