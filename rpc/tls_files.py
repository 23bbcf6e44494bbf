"""TLS settings of a service: which PEM files it has, from its flags or environment (SSD_TLS_*). No grpc here,
so a command line can take the flags without importing grpc; rpc/tls.py turns them into credentials.

As a server a service presents `cert` / `key` and, with `ca`, requires and verifies client certificates
(mutual TLS). As a client it verifies the server against `ca` and presents `client_cert` / `client_key`
(default: its own `cert` / `key`). No files = plaintext.
"""

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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


def tls_files(a: argparse.Namespace) -> TlsFiles:
    """The files `add_tls_flags` named; TlsConfigError for a half-given pair."""
    return TlsFiles(cert=a.tls_cert, key=a.tls_key, ca=a.tls_ca, client_cert=a.tls_client_cert,
                    client_key=a.tls_client_key)


def tls_from_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> TlsFiles:
    """`tls_files`; a half-given pair exits with the usage line."""
    try:
        return tls_files(a)
    except TlsConfigError as e:
        p.error(str(e))
