"""The layering rules (docs/architecture.md), as import-linter contracts in pyproject.toml.

(`make lint` runs every contract; this test checks the ones this part of the tree owns, so a
violation in a service fails the test suite too.)
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = [
    "The layer stack",
    "The layer stack of the engine library",
    "The gateway and the load generator never import torch or the engine",
    "The load generator speaks only the protos: no service code",
    "The gRPC plumbing and the protos never import torch",
    "The engine never imports grpc",
]


@pytest.fixture(scope="module")
def report() -> str:
    exe = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(exe), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


@pytest.mark.parametrize("contract", CONTRACTS)
def test_contract_is_kept(report, contract):
    lines = [line for line in report.splitlines() if line.startswith(contract)]
    assert lines, f"contract {contract!r} missing from the import-linter report:\n{report}"
    assert "KEPT" in lines[0], lines[0]


def test_no_contract_has_exceptions():
    """The layers hold without exceptions: no contract lists `ignore_imports`."""
    assert "ignore_imports" not in (REPO / "pyproject.toml").read_text()
