"""One proto root for every language: protos/ holds package ssd.v1 in ssd/v1/, the files import each other
from that root, carry the language package options, and compile unchanged with that single include path."""

import re
import shutil
import subprocess
from pathlib import Path

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from protos import build

PROTO_ROOT = build.PROTOS
WELL_KNOWN = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto, which protoc ships too
OPTIONS = {"go_package": "github.com/ssd-serve/ssd-serve/gen/go/ssd/v1;ssdv1",
           "java_package": "io.github.ssdserve.ssd.v1", "java_multiple_files": True,
           "csharp_namespace": "Ssd.V1", "php_namespace": "Ssd\\V1", "ruby_package": "Ssd::V1"}


def sources() -> list[str]:
    return [str(p.relative_to(PROTO_ROOT)) for p in build.proto_files()]


def test_imports_resolve_from_the_proto_root():
    for path in build.proto_files():
        for imported in re.findall(r'^import "([^"]+)";', path.read_text(), re.MULTILINE):
            assert not imported.startswith("protos/"), f"{path.name} imports {imported} from the repo root"
            assert (PROTO_ROOT / imported).is_file() or (WELL_KNOWN / imported).is_file(), (path, imported)


def test_grpc_tools_compiles_them_from_the_one_root_with_the_language_options(tmp_path):
    out = tmp_path / "ssd.binpb"
    assert protoc.main(["protoc", f"-I{PROTO_ROOT}", f"-I{WELL_KNOWN}", f"--descriptor_set_out={out}",
                        *sources()]) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert sorted(f.name for f in files) == sources()
    for f in files:
        assert f.package == "ssd.v1" and f.name.startswith("ssd/v1/")  # folder = package (buf lint)
        assert {name: getattr(f.options, name) for name in OPTIONS} == OPTIONS, f.name
        assert f.options.java_outer_classname == Path(f.name).stem.capitalize() + "Proto"


def test_the_python_stubs_live_under_protos_and_never_import_the_engine():
    generated = "from ssd.v1 import common_pb2 as x\n"
    assert build.move_under_package(generated) == "from protos.ssd.v1 import common_pb2 as x\n"
    assert build.generated_files(), "no stubs: run `make protos`"
    for path in build.generated_files():
        text = path.read_text()
        assert not re.search(r"^(from|import) ssd\b", text, re.MULTILINE), path.name
        assert not re.search(r"'ssd\.v1\.\w+_pb2'", text), path.name  # classes' __module__: protos.ssd.v1.*
    from protos.ssd.v1 import gateway_pb2

    assert gateway_pb2.GenerateRequest.__module__ == "protos.ssd.v1.gateway_pb2"
    assert gateway_pb2.DESCRIPTOR.name == "ssd/v1/gateway.proto"  # the name every language's stubs register


@pytest.mark.parametrize("language", ["cpp", "java", "csharp", "php", "ruby", "objc"])
def test_protoc_compiles_them_for_other_languages(tmp_path, language):
    if shutil.which("protoc") is None:
        pytest.skip("protoc is not installed (apt-get install protobuf-compiler)")
    done = subprocess.run(["protoc", f"-I{PROTO_ROOT}", f"--{language}_out={tmp_path}", *sources()],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert any(tmp_path.rglob("*"))
