"""The project's CPU kernels as one C++ extension: its sources, its build (once per source, flags and CPU, into
the caller's cache folder) and the kernel paths this CPU runs.

Sources: int4_gemm.cpp (group-32 int4 weights, GGUF Q4_0 / Q4_1), q8_gemm.cpp (group-32 int8 weights, GGUF
Q8_0), dense_gemm.cpp (plain float32 weights, a few rows), bf16_gemm.cpp (bfloat16 weights in blocks, AVX512-BF16)
and bf16_amx.cpp (the same blocks as AMX tiles, AMX-BF16), int4_bf16_gemm.cpp and q8_bf16_gemm.cpp (group-32 int4 /
int8 weights in blocks for bfloat16 x, AVX512-BF16, on the loop of bf16_dot_units.h), layer_ops.cpp (RMSNorm,
RoPE, SiLU-and-multiply, few-query paged attention; AVX-512 helpers in vector512.h), row_argmax.cpp (the greedy
token of each row of logits), decoder_layer.cpp (a whole Llama decoder layer as one call of those, with its
linears), module.cpp (CPU feature detection and the bindings), cpu_kernels.h (what they share).
`load_extension` raises `KernelBuildError` where it cannot build; each kernel's layout, launcher and plain-torch
reference live in its own module (int4_gemm.py, q8_gemm.py, dense_gemm.py, bf16_gemm.py, int4_bf16_gemm.py,
q8_bf16_gemm.py).
"""

import hashlib
import platform
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

FLOAT_AVX2, FLOAT_AVX512, VNNI_AVX512, BF16_AVX512, AMX_BF16 = 1, 2, 4, 8, 16  # the kernels' paths (`supported_paths`)
_FOLDER = Path(__file__).parent
_SOURCES = ("int4_gemm.cpp", "q8_gemm.cpp", "dense_gemm.cpp", "bf16_gemm.cpp", "bf16_amx.cpp", "int4_bf16_gemm.cpp",
            "q8_bf16_gemm.cpp", "layer_ops.cpp", "attention_amx.cpp", "row_argmax.cpp", "decoder_layer.cpp", "module.cpp")
_HEADERS = ("cpu_kernels.h", "vector512.h", "bf16_dot_units.h", "group_amx_units.h", "group_gemm.h", "amx_tiles.h")
_CFLAGS = ["-O3", "-fopenmp"]  # the ISA is chosen per function (target attributes), not for the whole file


class KernelBuildError(RuntimeError):
    """The C++ extension could not be compiled or loaded here."""


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return " ".join(sorted(f for f in line.split() if f.startswith(("avx", "fma", "f16c", "amx"))))


def build_key() -> str:
    """What a build depends on: the sources and where they are, the flags, torch and the CPU's vector extensions.
    The place counts because ninja rebuilds when the source paths in its build file change: two checkouts of the
    same code would otherwise take turns rebuilding one folder (minutes each, past a service's start-up wait)."""
    parts = [(_FOLDER / name).read_bytes() for name in (*_SOURCES, *_HEADERS)]
    parts += [str(_FOLDER.resolve()).encode()]
    parts += [" ".join(_CFLAGS).encode(), torch.__version__.encode(), _cpu_flags().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


@cache
def load_extension(build_root: Path) -> ModuleType:
    """The compiled extension (built under `build_root` at first use, then loaded from there)."""
    from torch.utils import cpp_extension

    key = build_key()
    folder = build_root / f"cpu_kernels-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return cpp_extension.load(name=f"ssd_cpu_kernels_{key}", sources=[str(_FOLDER / s) for s in _SOURCES],
                                  extra_cflags=_CFLAGS, extra_include_paths=[str(_FOLDER)],
                                  build_directory=str(folder), verbose=False)
    except (OSError, RuntimeError, ImportError) as e:  # no compiler, a failed compile, a broken cache
        raise KernelBuildError(f"the CPU kernels could not be built in {folder}: {e}") from e


def supported_paths(ext: ModuleType) -> list[int]:
    """The paths (FLOAT_AVX2, FLOAT_AVX512, VNNI_AVX512, BF16_AVX512, AMX_BF16) this CPU runs (AMX_BF16: the OS
    let this process use the tiles too)."""
    bits = ext.supported_paths()
    return [path for path in (FLOAT_AVX2, FLOAT_AVX512, VNNI_AVX512, BF16_AVX512, AMX_BF16) if bits & path]


def float_path(ext: ModuleType) -> int:
    """The fastest float32 path this CPU runs (the caller checked it runs one)."""
    return FLOAT_AVX512 if FLOAT_AVX512 in supported_paths(ext) else FLOAT_AVX2
