"""TLS and mutual TLS for every gRPC hop (gateway -> target -> draft): credentials and channels from a
service's TlsFiles (rpc/tls_files.py). A client uses TLS when it has a CA; a server when it has a certificate.
"""

import ipaddress
from collections.abc import Sequence
from pathlib import Path

import grpc
import structlog
from grpc import aio

from rpc.tls_files import TlsConfigError, TlsFiles

log = structlog.get_logger(__name__)

def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TlsConfigError(f"cannot read TLS file {path}: {e}") from e


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server TLS; mutual TLS (client certificates required and verified) when a CA is given."""
    key, cert = _read(tls.key), _read(tls.cert)
    ca = _read(tls.ca)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=_read(tls.ca),
                                        private_key=_read(tls.client_key or tls.key),
                                        certificate_chain=_read(tls.client_cert or tls.cert))


def sync_channel(address: str, tls: TlsFiles | None, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """A blocking channel: TLS when `tls` has a CA, else plaintext."""
    if tls is not None and tls.is_client_tls:
        return grpc.secure_channel(address, channel_credentials(tls), options=list(options))
    return grpc.insecure_channel(address, options=list(options))


def aio_channel(address: str, tls: TlsFiles | None, options: Sequence[tuple[str, object]] = ()) -> aio.Channel:
    """An asyncio channel: TLS when `tls` has a CA, else plaintext."""
    if tls is not None and tls.is_client_tls:
        return aio.secure_channel(address, channel_credentials(tls), options=list(options))
    return aio.insecure_channel(address, options=list(options))


def is_loopback(address: str) -> bool:
    """Whether host:port listens on the loopback interface only."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name (or "" / "0.0.0.0"-like wildcards): reachable from outside
