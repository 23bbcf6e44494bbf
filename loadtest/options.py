"""The load test's settings, built once from ghz-style flags."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadOptions:
    host: str  # "127.0.0.1:50051"
    call: str  # "ssd.v1.Verifier.GetInfo"
    data: str = "{}"  # request message as JSON
    metadata: tuple[tuple[str, str], ...] = ()
    concurrency: int = 50  # ghz -c: workers
    total: int = 200  # ghz -n: requests; ignored when duration_s is set
    duration_s: float | None = None  # ghz -z
    rps: float | None = None  # ghz --rps: overall request rate limit; None = as fast as possible
    connections: int = 1  # channels the workers share, round-robin
    timeout_s: float = 20.0  # per-call deadline (ghz -t)
    is_insecure: bool = False  # ghz --insecure: plaintext; otherwise TLS
