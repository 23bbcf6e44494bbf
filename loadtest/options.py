"""The load test's settings, built once from ghz-style flags."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoadOptions:
    host: str  # "127.0.0.1:50051"
    call: str  # "ssd.v1.Verifier.GetInfo"
    data: str = "{}"  # request message as JSON (ghz -d); a JSON array: one stream's messages, or round-robin items
    data_file: Path | None = None  # ghz -D: the data in a file; a .jsonl file holds one item (stream) per line
    metadata: tuple[tuple[str, str], ...] = ()
    concurrency: int = 50  # ghz -c: workers
    total: int = 200  # ghz -n: requests; ignored when duration_s is set
    duration_s: float | None = None  # ghz -z
    rps: float | None = None  # ghz --rps: overall request rate limit; None = as fast as possible
    connections: int = 1  # channels the workers share, round-robin
    timeout_s: float = 20.0  # per-call deadline (ghz -t)
    is_insecure: bool = False  # ghz --insecure: plaintext; otherwise TLS
    proto: Path | None = None  # ghz --proto: resolve the method from this .proto file
    import_paths: tuple[Path, ...] = ()  # ghz -i: where --proto's imports resolve
    protoset: Path | None = None  # ghz --protoset: a compiled FileDescriptorSet
    stream_interval_s: float = 0.0  # ghz --stream-interval: wait between two messages of a stream
    stream_call_count: int = 0  # ghz --stream-call-count: close a stream after this many messages (0 = all)
    stream_call_duration_s: float | None = None  # ghz --stream-call-duration: close a stream after this long
    is_stream_dynamic: bool = False  # ghz --stream-dynamic-messages: render templates per message, not per call
    lockstep_field: str | None = None  # bidi: after a message whose FIELD is set, wait for the reply echoing it
