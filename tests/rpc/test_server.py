"""rpc/server.py: ports are bound exclusively, and TLS / mutual TLS from PEM files."""

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rpc.server import GrpcServer, PortInUseError, check_port_free
from rpc.tls import aio_channel
from rpc.tls_files import TlsFiles
from tests.certificates import write_certificates


def _busy_listener() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def test_a_taken_port_is_a_clear_error_not_a_shared_port():
    holder, address = _busy_listener()
    with holder:
        with pytest.raises(PortInUseError, match="cannot listen on"):
            check_port_free(address)

        async def second_server() -> None:
            GrpcServer([], address, {})

        with pytest.raises(PortInUseError):
            asyncio.run(second_server())


def test_two_grpc_servers_cannot_share_a_port():
    async def run() -> None:
        first = GrpcServer([], "127.0.0.1:0", {})
        await first.start()
        try:
            with pytest.raises(PortInUseError):
                GrpcServer([], f"127.0.0.1:{first.port}", {})
        finally:
            await first.server.stop(0)

    asyncio.run(run())


async def _health(address: str, tls: TlsFiles | None) -> int:
    async with aio_channel(address, tls) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


def test_mutual_tls_serves_clients_with_a_certificate_and_refuses_others(tmp_path):
    certs = write_certificates(tmp_path / "ok")
    other = write_certificates(tmp_path / "other", ca_name="another-ca")
    server_tls = TlsFiles(cert=certs["cert"], key=certs["key"], ca=certs["ca"])

    async def run() -> None:
        server = GrpcServer([], "127.0.0.1:0", {}, tls=server_tls)
        await server.start()
        address = f"127.0.0.1:{server.port}"
        try:
            assert await _health(address, server_tls) == health_pb2.HealthCheckResponse.SERVING
            for client in (TlsFiles(ca=certs["ca"]),  # no client certificate
                           TlsFiles(cert=other["cert"], key=other["key"], ca=certs["ca"]),  # signed by another CA
                           None):  # plaintext
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _health(address, client)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.server.stop(0)

    asyncio.run(run())


def test_half_a_key_pair_is_refused():
    from rpc.tls_files import TlsConfigError

    with pytest.raises(TlsConfigError):
        TlsFiles(cert=__file__)


def test_a_model_service_bound_beyond_loopback_without_tls_is_warned_about():
    from structlog.testing import capture_logs

    from rpc.tls import is_loopback

    assert is_loopback("127.0.0.1:1") and is_loopback("localhost:1") and is_loopback("[::1]:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback("[::]:1") and not is_loopback("example.org:1")

    async def bind(address: str) -> list[str]:
        with capture_logs() as logs:
            GrpcServer([], address, {}, is_internal=True)
        return [e["event"] for e in logs if e["log_level"] == "warning"]

    assert asyncio.run(bind("127.0.0.1:0")) == []
    assert any("plaintext" in event for event in asyncio.run(bind("0.0.0.0:0")))


def test_a_server_can_take_a_smaller_receive_limit():
    from rpc.options import MAX_MESSAGE_BYTES
    from rpc.server import _server_options

    shared = dict(_server_options(None))
    assert shared["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES and shared["grpc.so_reuseport"] == 0
    limited = _server_options(4 << 20)
    assert [v for k, v in limited if k == "grpc.max_receive_message_length"] == [4 << 20]
