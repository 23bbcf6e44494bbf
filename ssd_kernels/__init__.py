"""Kernels: Triton kernels for attention over the paged KV cache, KV stores, RMSNorm and rotary embedding.

Each module holds one kernel, its launcher (which validates layouts and raises ValueError) and a plain-torch
`*_reference` twin that runs without Triton. This package imports torch and (optionally) triton only, never
the engine. `ssd_kernels.HAS_TRITON` says whether the Triton kernels exist in this process; importing the package
alone imports neither torch nor triton. `ssd_kernels.cpu` holds C++ CPU kernels (built at first use, each with its
launcher and plain-torch reference).
"""


def __getattr__(name: str) -> object:
    if name == "HAS_TRITON":  # resolved on first use, so `import ssd_kernels` stays light
        from ssd_kernels._triton import HAS_TRITON

        return HAS_TRITON
    raise AttributeError(f"module 'ssd_kernels' has no attribute {name!r}")
