"""Builds and runs a grpc.aio server the same way for every service.

Health (grpc.health.v1) and reflection are always on, options come from rpc/options.py, errors
go through one ErrorMappingInterceptor. SIGTERM / SIGINT: health NOT_SERVING, drain in-flight
calls for `grace_s`, stop, then run the service's own `on_stop`.
"""

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rpc.errors import ErrorMappingInterceptor, StatusTable
from rpc.options import SERVER_OPTIONS

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ServiceSpec:
    """One servicer to register: `add(servicer, server)` is the generated add_*_to_server function."""

    name: str  # full service name, e.g. "ssd.v1.Verifier" (health and reflection)
    servicer: object
    add: Callable[[object, aio.Server], None]


class GrpcServer:
    def __init__(self, services: Sequence[ServiceSpec], address: str, status_table: StatusTable,
                 grace_s: float = 10.0) -> None:
        self.services = list(services)
        self.address = address
        self.grace_s = grace_s
        self.health = health.aio.HealthServicer()
        self.server = aio.server(interceptors=[ErrorMappingInterceptor(status_table)], options=SERVER_OPTIONS)
        for spec in self.services:
            spec.add(spec.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [s.name for s in self.services]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = self.server.add_insecure_port(address)
        self._stopping = asyncio.Event()

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

