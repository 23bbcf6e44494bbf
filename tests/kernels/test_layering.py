"""ssd_kernels/ is this repo's package (PyPI's unrelated `kernels` comes with transformers); it imports no project package."""

import subprocess
import sys
from pathlib import Path

import ssd_kernels

REPO = Path(__file__).resolve().parents[2]
CONTRACT = "The kernels import torch and triton only, never a project package"


def test_kernels_resolves_inside_the_repo():
    assert Path(ssd_kernels.__file__).resolve().parent == REPO / "ssd_kernels"


def test_the_kernels_contract_is_kept():
    exe = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(exe), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(CONTRACT)]
    assert lines and "KEPT" in lines[0], done.stdout + done.stderr
