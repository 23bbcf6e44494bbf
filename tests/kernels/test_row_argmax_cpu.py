"""The greedy token of each row on the CPU kernel (ssd_kernels/cpu/row_argmax.cpp, ssd/sampling/greedy.py): every
path this CPU runs answers as torch.argmax does (the first index of the largest value, a NaN counting as the largest),
on ties, infinities, signed zeros, NaNs and row lengths around the vector widths; a path the CPU lacks is skipped."""

import pytest
import torch

from ssd.layers import cpu_kernels
from ssd.sampling.greedy import argmax_rows
from ssd_kernels.cpu import extension as own_ext
from tests.kernels.cpu_kernel_checks import require_path

PATHS = {"scalar": 0, "float-avx2": own_ext.FLOAT_AVX2, "float-avx512": own_ext.FLOAT_AVX512}
LENGTHS = [1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 8192]


def _rows(kind: str, n: int, v: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, v, generator=g)
    if kind == "ties":  # few distinct values: the first of the largest must win
        x = torch.randint(0, 3, (n, v), generator=g).float()
    elif kind == "nan":
        x[:, torch.randint(0, v, (1,), generator=g)] = float("nan")
        x[-1, -1] = float("nan")
    elif kind == "-inf":
        x[:] = float("-inf")
    elif kind == "+inf":
        x[:, -1] = x[:, v // 2] = float("inf")
    elif kind == "signed zeros":
        x[:] = -0.0
        x[:, v // 2 :] = 0.0
    elif kind == "last":  # the largest in the overlapping tail vector
        x[:, -1] = x.max() + 1
    return x


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("kind", ["random", "ties", "nan", "-inf", "+inf", "signed zeros", "last"])
def test_each_path_answers_as_torch_argmax(ext, name, kind):
    path = require_path(ext, PATHS, name) if PATHS[name] else 0
    g = torch.Generator().manual_seed(len(kind))
    for v in LENGTHS:
        x = _rows(kind, 3, v, g)
        assert torch.equal(ext.argmax_rows(x, path), x.argmax(dim=-1)), (kind, v)


def test_the_sampling_helper_matches_torch_and_keeps_torch_where_the_kernel_does_not_serve():
    assert cpu_kernels.extension() is not None and cpu_kernels.loaded_extension() is not None  # as an engine loads it
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 4, (80, 49152), generator=g).float()
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    half = x.bfloat16()  # not float32: torch's argmax
    assert torch.equal(argmax_rows(half), half.argmax(dim=-1))
    strided = x[:, ::2]  # not contiguous: made so
    assert torch.equal(argmax_rows(strided), strided.argmax(dim=-1))


def test_the_cases_would_catch_a_kernel_that_took_the_last_largest_or_skipped_the_tail():
    """Planted bugs, as answers: the last of equal largest values (>= in place of >), or a row's tail past its last
    full vector left out. The rows of the test above tell both from torch's answer."""
    g = torch.Generator().manual_seed(len("ties"))
    for v in [n for n in LENGTHS if n >= 2]:
        x = _rows("ties", 3, v, g)
        last = v - 1 - x.flip(-1).argmax(dim=-1)
        assert not torch.equal(last, x.argmax(dim=-1)), v
    g = torch.Generator().manual_seed(len("last"))
    for v in [n for n in LENGTHS if n > 16 and n % 16]:
        x = _rows("last", 3, v, g)
        assert not torch.equal(x[:, : v - v % 16].argmax(dim=-1), x.argmax(dim=-1)), v


def test_bad_input_is_refused(ext):
    with pytest.raises(RuntimeError, match="argmax_rows"):
        ext.argmax_rows(torch.zeros(2, 3, 4), 0)
    with pytest.raises(RuntimeError, match="argmax_rows"):
        ext.argmax_rows(torch.zeros(2, 0), 0)
    with pytest.raises(RuntimeError, match="argmax_rows"):
        ext.argmax_rows(torch.zeros(2, 8, dtype=torch.float64), 0)


def test_the_helper_never_builds_the_kernels_itself(monkeypatch):
    """In a process that has not loaded the kernels (a GPU engine's host work), torch.argmax answers: no build."""
    monkeypatch.setattr(cpu_kernels, "loaded_extension", lambda: None)
    built = []
    monkeypatch.setattr(cpu_kernels, "extension", lambda: built.append(1))
    x = torch.randn(3, 40)
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1)) and not built
