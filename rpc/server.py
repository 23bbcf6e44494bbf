"""Builds and runs a grpc.aio server the same way for every service.

Health (grpc.health.v1) and reflection are always on, options come from rpc/options.py, errors
go through one ErrorMappingInterceptor. SIGTERM / SIGINT: health NOT_SERVING, drain in-flight
calls for `grace_s`, stop, then run the service's own `on_stop`.
Ports are bound exclusively (no SO_REUSEPORT): a port another process holds is a PortInUseError at
start-up, never a second server sharing it. TLS (rpc/tls.py) when the service has a certificate; a
plaintext server bound beyond loopback logs a warning.
"""

import asyncio
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rpc.errors import ErrorMappingInterceptor, StatusTable
from rpc.options import SERVER_OPTIONS
from rpc.tls import is_loopback, server_credentials
from rpc.tls_files import TlsFiles

log = structlog.get_logger(__name__)


class PortInUseError(RuntimeError):
    """The server's address cannot be bound (another process holds the port, or the host is not local)."""


def listening_socket(address: str) -> socket.socket:
    """A TCP socket bound to host:port (SO_REUSEADDR, as grpc binds: connections of a previous instance in
    TIME_WAIT do not count), for a server to listen on; PortInUseError when a listener holds the port."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host if host not in ("", "*") else "", int(port)))
    except OSError as e:
        s.close()
        raise PortInUseError(f"cannot listen on {address}: {e.strerror}") from e
    return s


def check_port_free(address: str) -> None:
    """Raise PortInUseError now when host:port is held by a listener: a service calls it before its slow
    start-up (loading a model), so a busy port fails in a second."""
    listening_socket(address).close()


@dataclass(frozen=True)
class HostedService:
    """One servicer to register: `add(servicer, server)` is the generated add_*_to_server function."""

    name: str  # full service name, e.g. "ssd.v1.Verifier" (health and reflection)
    servicer: object
    add: Callable[[object, aio.Server], None]


def _server_options(max_receive_bytes: int | None) -> list[tuple[str, int]]:
    options = [*SERVER_OPTIONS, ("grpc.so_reuseport", 0)]  # a taken port is an error, never a shared port
    if max_receive_bytes is not None:
        options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", max_receive_bytes))
    return options


class GrpcServer:
    def __init__(self, services: Sequence[HostedService], address: str, status_table: StatusTable,
                 grace_s: float = 10.0, tls: TlsFiles | None = None, is_internal: bool = False,
                 max_receive_bytes: int | None = None) -> None:
        """`max_receive_bytes`: a smaller limit on incoming messages than the shared one (the public gateway)."""
        self.services = list(services)
        self.address = address
        self.grace_s = grace_s
        self.health = health.aio.HealthServicer()
        self.server = aio.server(interceptors=[ErrorMappingInterceptor(status_table)],
                                 options=_server_options(max_receive_bytes))
        for service in self.services:
            service.add(service.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [s.name for s in self.services]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = self._bind(address, tls, is_internal)
        self._stopping = asyncio.Event()

    def _bind(self, address: str, tls: TlsFiles | None, is_internal: bool) -> int:
        """`is_internal`: a model service (no auth of its own), warned about when reachable without TLS."""
        is_tls = tls is not None and tls.is_server_tls
        if is_internal and not is_tls and not is_loopback(address):
            log.warning("serving plaintext gRPC beyond localhost: anyone who reaches this port can call it; "
                        "give the service --tls-cert / --tls-key / --tls-ca", address=address)
        try:
            if is_tls:
                return self.server.add_secure_port(address, server_credentials(tls))
            return self.server.add_insecure_port(address)
        except RuntimeError as e:  # grpc's "Failed to bind to address"
            raise PortInUseError(f"cannot listen on {address}: the port is in use (or the host is not this "
                                 "machine's)") from e

    async def _set_all(self, status: int) -> None:
        for name in ["", *(s.name for s in self.services)]:
            await self.health.set(name, status)

    async def start(self) -> None:
        await self.server.start()
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", address=self.address, port=self.port, services=[s.name for s in self.services])

    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self, on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
        """Start, serve until SIGTERM / SIGINT (or request_stop), then drain and stop."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        await self._stopping.wait()
        log.info("shutting down", grace_s=self.grace_s)
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(self.grace_s)
        if on_stop is not None:
            await on_stop()
        log.info("stopped")

