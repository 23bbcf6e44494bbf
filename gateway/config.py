"""The gateway's frozen config, built once from flags and environment (SSD_GATEWAY_*, SSD_API_KEYS).

Limits (issue 31) live here too: request and prompt sizes (checked before any tokenizing), the admission
queue (in-flight + waiting), per-key concurrency and rate limits, the HTTP body-read timeout and the default
request deadline. Each is validated once; `None` turns an optional limit off.
"""

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
    is_metrics_guarded: bool = False  # /metrics and /openapi.json need the API key too
    model_name: str | None = None  # public model name; None = the targets' name
    max_request_bytes: int = 1 << 20  # HTTP body size limit
    max_grpc_message_bytes: int = 4 << 20  # a Generation gRPC request's size limit
    max_prompt_bytes: int = 1 << 20  # the prompt's text (all messages, tools) in UTF-8, checked before tokenizing
    max_prompt_chars: int | None = None  # the same in characters; None = 16 x the prompt-token limit
    max_prompt_tokens: int | None = None  # None = the target's max_model_len - 1
    default_max_tokens: int = 256  # when a request names none
    max_in_flight: int = 256  # generation requests served at once (HTTP and gRPC together)
    max_waiting: int = 512  # requests queued for a slot past max_in_flight; more are refused (429)
    max_key_in_flight: int | None = None  # per API key, requests in flight or waiting; None = no limit
    key_requests_per_minute: float | None = None  # per API key (token bucket); None = no limit
    key_burst: int | None = None  # the bucket's size; None = one minute's worth
    body_read_timeout_s: float = 30.0  # an HTTP body must arrive within this (408 past it)
    default_timeout_s: float | None = None  # a request's deadline when it names none; None = no deadline
    num_cpu_threads: int = 2  # tokenizing and chat templates run on these threads, off the event loop
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
        for name in ("max_request_bytes", "max_grpc_message_bytes", "max_prompt_bytes", "max_prompt_chars",
                     "max_prompt_tokens", "default_max_tokens", "max_in_flight", "max_key_in_flight", "key_burst",
                     "num_cpu_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.max_waiting < 0:
            raise ConfigError(f"max_waiting must be >= 0, got {self.max_waiting}")
        for name in ("key_requests_per_minute", "body_read_timeout_s", "default_timeout_s", "health_interval_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")


def _load_keys(path: str | None, env_value: str | None) -> frozenset[str]:
    keys = set()
    if path:
        keys |= {line.strip() for line in Path(path).read_text().splitlines() if line.strip() and not line.startswith("#")}
    if env_value:
        keys |= {k.strip() for k in env_value.split(",") if k.strip()}
    return frozenset(keys)


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = GatewayConfig.__dataclass_fields__
    g = p.add_argument_group("limits")
    g.add_argument("--max-request-bytes", type=int, default=d["max_request_bytes"].default,
                   help="HTTP body size limit; past it 413 (default: 1 MiB)")
    g.add_argument("--max-grpc-message-bytes", type=int, default=d["max_grpc_message_bytes"].default,
                   help="Generation gRPC request size limit; past it RESOURCE_EXHAUSTED (default: 4 MiB)")
    g.add_argument("--max-prompt-bytes", type=int, default=d["max_prompt_bytes"].default,
                   help="prompt text (messages, tools) in UTF-8 bytes, checked before tokenizing (default: 1 MiB)")
    g.add_argument("--max-prompt-chars", type=int, default=None,
                   help="prompt text in characters, checked before tokenizing (default: 16 x the token limit)")
    g.add_argument("--max-prompt-tokens", type=int, default=None, help="default: the target's max_model_len - 1")
    g.add_argument("--default-max-tokens", type=int, default=d["default_max_tokens"].default)
    g.add_argument("--max-in-flight", type=int, default=d["max_in_flight"].default,
                   help="generation requests served at once, HTTP and gRPC together (default: 256)")
    g.add_argument("--max-waiting", type=int, default=d["max_waiting"].default,
                   help="requests queued past --max-in-flight; more get 429 / RESOURCE_EXHAUSTED (default: 512)")
    g.add_argument("--max-key-in-flight", type=int, default=None,
                   help="per API key: requests in flight or waiting; more get 429 (default: no limit)")
    g.add_argument("--key-requests-per-minute", type=float, default=None,
                   help="per API key: a token-bucket rate limit; past it 429 with Retry-After (default: off)")
    g.add_argument("--key-burst", type=int, default=None, help="the rate limit's bucket size (default: a minute's)")
    g.add_argument("--body-read-timeout-s", type=float, default=d["body_read_timeout_s"].default,
                   help="an HTTP request body must arrive within this; past it 408 (default: 30)")
    g.add_argument("--default-timeout-s", type=float, default=None,
                   help="deadline of a request that names no `timeout`; past it 504 / DEADLINE_EXCEEDED "
                        "(default: none)")
    g.add_argument("--cpu-threads", type=int, default=d["num_cpu_threads"].default,
                   help="threads that tokenize and render chat templates, off the event loop (default: 2)")


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    env = os.environ
    p = argparse.ArgumentParser(prog="gateway", description="ssd-serve gateway (gRPC + OpenAI HTTP)")
    p.add_argument("--target", action="append", default=None, help="target replica host:port (repeatable)")
    p.add_argument("--http-address", default=env.get("SSD_GATEWAY_HTTP", "127.0.0.1:8000"))
    p.add_argument("--grpc-address", default=env.get("SSD_GATEWAY_GRPC", "127.0.0.1:50050"))
    p.add_argument("--api-key-file", default=env.get("SSD_API_KEY_FILE"))
    p.add_argument("--no-auth", action="store_true", help="accept requests without an API key (local use)")
    p.add_argument("--guard-metrics", action="store_true",
                   help="/metrics and /openapi.json need the API key too (Prometheus: a bearer token)")
    p.add_argument("--model-name", default=None)
    _add_limit_flags(p)
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
        is_metrics_guarded=a.guard_metrics, model_name=a.model_name, max_request_bytes=a.max_request_bytes,
        max_grpc_message_bytes=a.max_grpc_message_bytes, max_prompt_bytes=a.max_prompt_bytes,
        max_prompt_chars=a.max_prompt_chars, max_prompt_tokens=a.max_prompt_tokens,
        default_max_tokens=a.default_max_tokens, max_in_flight=a.max_in_flight, max_waiting=a.max_waiting,
        max_key_in_flight=a.max_key_in_flight, key_requests_per_minute=a.key_requests_per_minute,
        key_burst=a.key_burst, body_read_timeout_s=a.body_read_timeout_s, default_timeout_s=a.default_timeout_s,
        num_cpu_threads=a.cpu_threads, health_interval_s=a.health_interval_s, log_level=a.log_level,
        log_json=not a.log_text)
