"""A model service's Prometheus `/metrics` on an HTTP port of its own (a daemon thread beside the gRPC server).

The target and the draft speak only gRPC on their service port, so their metrics get a second, plain HTTP
port (`--metrics-port`, 0 = none). It listens on the host of the service's gRPC address. Nothing here knows
which metrics exist: the caller hands over a registry (its `metrics.py`), read at each scrape.
"""

import argparse
import errno
import threading
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import CollectorRegistry, start_http_server

from rpc.server import PortInUseError, check_port_free

log = structlog.get_logger(__name__)

METRICS_LABELS = ("model_name", "engine")  # vLLM's label names on every engine-side series
ENGINE_INDEX = "0"  # vLLM's `engine` label: the data-parallel engine index; one engine per service here


def add_metrics_port_flag(p: argparse.ArgumentParser, env: Mapping[str, str], env_var: str) -> None:
    p.add_argument("--metrics-port", type=int, default=int(env.get(env_var, "0")),
                   help=f"serve Prometheus /metrics over HTTP on this port, on the host of --address "
                        f"(0 = off; env {env_var})")


def host_of(address: str) -> str:
    """'0.0.0.0:50051' -> '0.0.0.0'; '[::]:50051' -> '::'."""
    return address.rsplit(":", 1)[0].strip("[]")


class MetricsHttpServer:
    """Serves one registry at http://host:port/metrics until `stop`."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread; PortInUseError when the port is taken."""
        try:
            self._server, self._thread = start_http_server(self.port, self.host, self.registry)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                raise PortInUseError(f"cannot serve metrics on {self.host}:{self.port}: {e.strerror}") from e
            raise
        log.info("metrics served", url=f"http://{self.host}:{self.port}/metrics")

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def check_metrics_port_free(address: str, port: int) -> None:
    """PortInUseError now (before a slow start-up) when the metrics port is set and taken."""
    if port:
        check_port_free(f"{host_of(address)}:{port}")


def start_metrics_server(registry: CollectorRegistry, address: str, port: int) -> MetricsHttpServer | None:
    """The metrics server of a service listening on gRPC `address`, started; None when `port` is 0."""
    if port == 0:
        return None
    server = MetricsHttpServer(registry, host_of(address), port)
    server.start()
    return server
