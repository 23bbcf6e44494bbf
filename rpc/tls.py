"""TLS and mutual TLS for every gRPC hop (gateway -> target -> draft), certificates read from PEM files.

One `TlsFiles` per service, from its flags or environment (SSD_TLS_*). As a server it presents `cert` / `key`
and, with `ca`, requires and verifies client certificates (mutual TLS). As a client it verifies the server
against `ca` and presents `client_cert` / `client_key` (default: its own `cert` / `key`). No files = plaintext.
"""

import argparse
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog
from grpc import aio

log = structlog.get_logger(__name__)

ENV = {"cert": "SSD_TLS_CERT", "key": "SSD_TLS_KEY", "ca": "SSD_TLS_CA",
       "client_cert": "SSD_TLS_CLIENT_CERT", "client_key": "SSD_TLS_CLIENT_KEY"}


class TlsConfigError(ValueError):
    """A TLS flag combination that cannot work, or a certificate file that cannot be read."""


@dataclass(frozen=True)
class TlsFiles:
    cert: Path | None = None  # this service's certificate chain (PEM), presented as a server
    key: Path | None = None  # its private key (PEM)
    ca: Path | None = None  # CA bundle: verifies peers (the server a client calls; clients, when set on a server)
    client_cert: Path | None = None  # presented when calling another service; None = `cert`
    client_key: Path | None = None  # None = `key`

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsConfigError("--tls-cert and --tls-key go together")
        if (self.client_cert is None) != (self.client_key is None):
            raise TlsConfigError("--tls-client-cert and --tls-client-key go together")

    @property
    def is_server_tls(self) -> bool:
        return self.cert is not None

    @property
    def is_client_tls(self) -> bool:
        """A client uses TLS when it has a CA to verify the server against."""
        return self.ca is not None

    def as_args(self) -> list[str]:
        """The flags that give a child service these files."""
        out = []
        for name, value in vars(self).items():
            if value is not None:
                out += [f"--tls-{name.replace('_', '-')}", str(value)]
        return out


def add_tls_flags(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    g = p.add_argument_group("TLS (every gRPC hop; PEM files; none = plaintext)")
    g.add_argument("--tls-cert", type=Path, default=env.get(ENV["cert"]) or None, help="server certificate chain")
    g.add_argument("--tls-key", type=Path, default=env.get(ENV["key"]) or None, help="server private key")
    g.add_argument("--tls-ca", type=Path, default=env.get(ENV["ca"]) or None,
                   help="CA bundle: verifies the services this one calls and, on a server with a certificate, "
                        "requires client certificates signed by it (mutual TLS)")
    g.add_argument("--tls-client-cert", type=Path, default=env.get(ENV["client_cert"]) or None,
                   help="certificate presented when calling another service (default: --tls-cert)")
    g.add_argument("--tls-client-key", type=Path, default=env.get(ENV["client_key"]) or None,
                   help="its key (default: --tls-key)")


def tls_from_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> TlsFiles:
    """The files `add_tls_flags` named; a half-given pair exits with the usage line."""
    try:
        return TlsFiles(cert=a.tls_cert, key=a.tls_key, ca=a.tls_ca, client_cert=a.tls_client_cert,
                        client_key=a.tls_client_key)
    except TlsConfigError as e:
        p.error(str(e))


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
