"""The gateway's frozen config, built once from flags and environment (SSD_GATEWAY_*, SSD_API_KEYS)."""

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from rpc.tls_files import TlsFiles, add_tls_flags, tls_from_args


class ConfigError(ValueError):
    """A bad flag or environment value; the entry point reports it and exits."""


@dataclass(frozen=True)
class GatewayConfig:
    targets: tuple[str, ...]  # host:port of each target replica
    http_address: str = "127.0.0.1:8000"  # OpenAI-compatible HTTP bridge
    grpc_address: str = "127.0.0.1:50050"  # public Generation gRPC API
    api_keys: frozenset[str] = frozenset()  # accepted bearer keys
    is_auth_disabled: bool = False  # only when explicitly asked for (local use)
    model_name: str | None = None  # public model name; None = the targets' name
    max_request_bytes: int = 1 << 20  # HTTP body size limit
    max_prompt_tokens: int | None = None  # None = the target's max_model_len - 1
    default_max_tokens: int = 256  # when a request names none
    health_interval_s: float = 0.5  # target health / load polling period
    grace_s: float = 10.0
    log_level: str = "info"
    log_json: bool = True
    tls: TlsFiles = field(default_factory=TlsFiles)  # calling targets: a CA = TLS, a certificate = mutual TLS

    def __post_init__(self) -> None:
        if not self.targets:
            raise ConfigError("the gateway needs at least one target (--target host:port)")
        if not self.api_keys and not self.is_auth_disabled:
            raise ConfigError("no API keys: pass --api-key-file / SSD_API_KEYS, or --no-auth for local use")


def _load_keys(path: str | None, env_value: str | None) -> frozenset[str]:
    keys = set()
    if path:
        keys |= {line.strip() for line in Path(path).read_text().splitlines() if line.strip() and not line.startswith("#")}
    if env_value:
        keys |= {k.strip() for k in env_value.split(",") if k.strip()}
    return frozenset(keys)


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    env = os.environ
    p = argparse.ArgumentParser(prog="gateway", description="ssd-serve gateway (gRPC + OpenAI HTTP)")
    p.add_argument("--target", action="append", default=None, help="target replica host:port (repeatable)")
    p.add_argument("--http-address", default=env.get("SSD_GATEWAY_HTTP", "127.0.0.1:8000"))
    p.add_argument("--grpc-address", default=env.get("SSD_GATEWAY_GRPC", "127.0.0.1:50050"))
    p.add_argument("--api-key-file", default=env.get("SSD_API_KEY_FILE"))
    p.add_argument("--no-auth", action="store_true", help="accept requests without an API key (local use)")
    p.add_argument("--model-name", default=None)
    p.add_argument("--max-request-bytes", type=int, default=1 << 20)
    p.add_argument("--max-prompt-tokens", type=int, default=None)
    p.add_argument("--default-max-tokens", type=int, default=256)
    p.add_argument("--health-interval-s", type=float, default=0.5, help="target health / load polling period")
    p.add_argument("--log-level", default=env.get("SSD_LOG_LEVEL", "info"))
    p.add_argument("--log-text", action="store_true")
    add_tls_flags(p, env)
    a = p.parse_args(argv)
    targets = a.target or [t for t in env.get("SSD_GATEWAY_TARGETS", "").split(",") if t]
    return GatewayConfig(
        tls=tls_from_args(p, a),
        targets=tuple(targets), http_address=a.http_address, grpc_address=a.grpc_address,
        api_keys=_load_keys(a.api_key_file, env.get("SSD_API_KEYS")), is_auth_disabled=a.no_auth,
        model_name=a.model_name, max_request_bytes=a.max_request_bytes, max_prompt_tokens=a.max_prompt_tokens,
        default_max_tokens=a.default_max_tokens,
        health_interval_s=a.health_interval_s, log_level=a.log_level, log_json=not a.log_text)
