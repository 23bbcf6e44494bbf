"""The optional Triton import: `HAS_TRITON` is False where triton is not installed.

Kernel modules define their @triton.jit functions only when HAS_TRITON is True, so the plain-torch references
import and run everywhere. Under TRITON_INTERPRET=1 (read when triton is first imported) kernels run on CPU
tensors.
"""

import os

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the references still work; the launchers raise
    triton = None
    tl = None
    HAS_TRITON = False


def require_triton(name: str) -> None:
    """Raise RuntimeError when the Triton kernel `name` cannot run in this process."""
    if not HAS_TRITON:
        raise RuntimeError(f"{name} needs triton, which is not installed; use {name}_reference")


def is_interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
