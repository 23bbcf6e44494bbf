"""`python -m gateway --target 127.0.0.1:50051 --no-auth`: the gRPC API and the HTTP bridge in one event loop."""

import asyncio
import contextlib
import sys

import structlog
import uvicorn

from gateway.admission import Admission
from gateway.auth import ApiKeys
from gateway.config import ConfigError, GatewayConfig, parse_args
from gateway.generation import TextGenerator
from gateway.http_api import build_app
from gateway.metrics import GatewayMetrics
from gateway.router import Router
from gateway.servicer import GenerationServicer
from protos import require_current_stubs
from protos.ssd.v1 import gateway_pb2_grpc
from rpc.logging import configure_service_logging
from rpc.server import GrpcServer, HostedService, PortInUseError, listening_socket

log = structlog.get_logger(__name__)


class _HttpServer(uvicorn.Server):
    """uvicorn without its own signal handling: the gRPC server's SIGTERM handler stops both."""

    @contextlib.contextmanager
    def capture_signals(self):  # noqa: ANN201
        yield


async def serve(config: GatewayConfig) -> None:
    http_socket = listening_socket(config.http_address)  # ours, before anything starts: a taken port is one clear error
    router = Router(config.targets, config.health_interval_s, tls=config.tls)
    await router.start()
    metrics = GatewayMetrics(router, config.model_name)
    keys = ApiKeys(config.api_keys, config.is_auth_disabled)
    if config.is_auth_disabled:
        log.warning("API-key authentication is disabled")
    generator = TextGenerator(config, router, metrics)
    admission = Admission(config.max_in_flight, config.max_waiting, config.max_key_in_flight,
                          config.key_requests_per_minute, config.key_burst)
    metrics.watch(admission)
    app = build_app(generator, keys, config, metrics.render, admission)
    http = _HttpServer(uvicorn.Config(app, log_config=None, access_log=False,
                                      timeout_graceful_shutdown=int(config.grace_s)))
    http_task = asyncio.create_task(http.serve(sockets=[http_socket]))
    service = HostedService("ssd.v1.Generation", GenerationServicer(generator, keys, admission),
                       gateway_pb2_grpc.add_GenerationServicer_to_server)
    server = GrpcServer([service], config.grpc_address, {}, grace_s=config.grace_s,
                        max_receive_bytes=config.max_grpc_message_bytes)

    async def on_stop() -> None:
        http.should_exit = True
        await http_task
        await router.close()
        generator.cpu.close()

    await server.run(on_stop)


def main(argv: list[str] | None = None) -> None:
    try:
        config = parse_args(argv)
    except ConfigError as e:
        sys.stderr.write(f"gateway: {e}\n")
        raise SystemExit(2) from e
    configure_service_logging("gateway", config.log_level, json=config.log_json)
    require_current_stubs()
    try:
        asyncio.run(serve(config))
    except PortInUseError as e:  # one clear line, exit status 2 (a supervisor sees it)
        log.error("cannot start the gateway", http_address=config.http_address, grpc_address=config.grpc_address,
                  error=str(e))
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
