"""The wire contract: ssd/v1/*.proto and their generated stubs (built by protos/build.py, never committed)."""

from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "ssd" / "v1"


class StaleStubsError(RuntimeError):
    """The generated stubs are missing or older than the .proto files: run `make protos`."""


def stubs_are_current() -> bool:
    """Whether the generated stubs were built from the current .proto files."""
    from protos.build import proto_hash

    try:
        from protos.ssd.v1._proto_hash import PROTO_HASH
    except ImportError:
        return False
    return PROTO_HASH == proto_hash()


def require_current_stubs() -> None:
    """Raise StaleStubsError unless the stubs match the .proto files (services call this at start-up)."""
    if not stubs_are_current():
        raise StaleStubsError("the gRPC stubs are missing or stale: run `make protos` (python protos/build.py)")
