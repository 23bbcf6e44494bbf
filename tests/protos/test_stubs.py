"""The wire contract: stubs generated from the current .proto files, every field commented, our packages ours."""

import importlib
import re
from pathlib import Path

import pytest

import protos
from protos import build

REPO = Path(__file__).resolve().parents[2]


def test_stubs_are_current():
    assert protos.stubs_are_current(), "gRPC stubs are missing or stale: run `make protos` (python protos/build.py)"


def test_a_changed_proto_is_detected_as_stale(monkeypatch):
    monkeypatch.setattr(build, "proto_hash", lambda: "0" * 64)
    assert not protos.stubs_are_current()
    with pytest.raises(protos.StaleStubsError, match="make protos"):
        protos.require_current_stubs()


def test_every_field_and_enum_value_has_a_comment():
    field = re.compile(r"^\s*(optional\s+|repeated\s+)?[\w.]+\s+\w+\s*=\s*\d+.*;")
    for path in build.proto_files():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if field.match(line):
                assert lines[i - 1].strip().startswith("//"), f"{path.name}:{i + 1} has no comment: {line.strip()}"


@pytest.mark.parametrize("name", ["protos", "rpc", "gateway", "target_service", "draft_service", "deploy", "cli",
                                  "draft_training", "tensor_transport", "bench", "loadtest"])
def test_our_packages_resolve_inside_the_repo(name):
    """`protos`, `gateway` and `cli` exist as unrelated PyPI packages: make sure we import ours."""
    module = importlib.import_module(name)
    assert Path(module.__file__).resolve().is_relative_to(REPO), module.__file__
