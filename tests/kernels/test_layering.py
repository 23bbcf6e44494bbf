"""kernels/ is this repo's package (PyPI has an unrelated `kernels`) and imports no project package."""

import subprocess
import sys
from pathlib import Path

import kernels

REPO = Path(__file__).resolve().parents[2]
CONTRACT = "The kernels import torch and triton only, never a project package"


def test_kernels_resolves_inside_the_repo():
    assert Path(kernels.__file__).resolve().parent == REPO / "kernels"


def test_the_kernels_contract_is_kept():
    exe = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(exe), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(CONTRACT)]
    assert lines and "KEPT" in lines[0], done.stdout + done.stderr
