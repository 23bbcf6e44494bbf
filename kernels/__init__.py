"""Kernels: Triton kernels for attention over the paged KV cache, KV stores, RMSNorm and rotary embedding.

Each module holds one kernel, its launcher (which validates layouts and raises ValueError) and a plain-torch
`*_reference` twin that runs without Triton. This package imports torch and (optionally) triton only, never the
engine. `HAS_TRITON` says whether the Triton kernels exist in this process.
"""

from kernels._triton import HAS_TRITON

__all__ = ["HAS_TRITON"]
