"""Where triton is missing, every kernels module still imports, the references run and the launchers say why not."""

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
sys.modules["triton"] = None  # `import triton` now raises ImportError
import torch
import ssd_kernels
from ssd_kernels import packed_mask, paged_attention, prefill_attention, rmsnorm, rotary, store_kv
assert ssd_kernels.HAS_TRITON is False
x = torch.randn(3, 8)
rmsnorm.rms_norm_reference(x, torch.ones(8), 1e-6)
try:
    rmsnorm.rms_norm(x, torch.ones(8), 1e-6)
except RuntimeError as e:
    print(e)
"""


def test_references_import_and_run_without_triton():
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rms_norm needs triton, which is not installed; use rms_norm_reference" in done.stdout
