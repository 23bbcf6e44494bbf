"""The draft service's frozen config, built once from flags and environment (SSD_DRAFT_*)."""

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from rpc.metrics_http import add_metrics_port_flag
from rpc.tls_files import TlsFiles, add_tls_flags, tls_from_args
from ssd.cli_flags import SSD_FIELDS, STEP_FIELDS, add_config_flags, options_from_args, ssd_from_args
from ssd.config import MAX_LOOKAHEAD, EngineConfig, SsdConfig
from ssd.errors import InvalidRequestError

# the engine settings the service takes as flags (generated from ssd/cli_flags.py CONFIG_FLAGS, SSD_DRAFT_* defaults)
ENGINE_FIELDS = ("dtype", "device", "num_threads", "kv_cache_memory_mb", "block_size", "max_model_len", *STEP_FIELDS)
ENGINE_DEFAULTS = {"dtype": "float32", "num_threads": 1, "kv_cache_memory_mb": 256}  # the draft's, not the engine's


def draft_engine(draft: str = "ngram", **options: object) -> EngineConfig:
    """The engine settings of a draft service running `draft`: the service's defaults, then `options`."""
    return EngineConfig(draft, **{**ENGINE_DEFAULTS, **options})  # type: ignore[arg-type]


@dataclass(frozen=True)
class DraftServiceConfig:
    # what the draft runs: `model` is the draft ("ngram", a draft checkpoint or an EAGLE-3 head folder / known model
    # name), with its dtype, device, threads, its own KV budget and block size (an EAGLE-3 head's prefix-cache blocks:
    # the target's size), its step settings, and max_model_len (tokens per sequence; None = the draft's positions)
    engine: EngineConfig = field(default_factory=draft_engine)
    target_model: str | None = None  # the target checkpoint an EAGLE-3 head drafts for (its embedding + config)
    address: str = "127.0.0.1:50052"  # host:port to listen on
    metrics_port: int = 0  # Prometheus /metrics over HTTP on this port, on the host of `address`; 0 = off
    prefix_cache_blocks: int = 1024  # an EAGLE-3 head's own prefix cache, in blocks; 0 = off
    ngram_max: int = 3  # n-gram proposer: longest tail matched (also the SSD fast backup)
    ssd: SsdConfig = field(default_factory=SsdConfig)  # SSD defaults (a neural draft); a Round's SsdOptions override
    grace_s: float = 5.0  # drain time on SIGTERM
    # what a session's peer may ask (draft_service/limits.py); past these a round or a sequence is refused
    max_speculative_tokens: int = MAX_LOOKAHEAD  # lookahead K per round
    max_session_sequences: int = 256  # sequences one session holds
    tls: TlsFiles = field(default_factory=TlsFiles)  # server certificate; with a CA, targets must present one
    log_level: str = "info"
    log_json: bool = True

    @property
    def draft(self) -> str:
        return self.engine.model

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise InvalidRequestError(f"metrics port must be in [0, 65535] (0 = off), got {self.metrics_port}")
        if self.prefix_cache_blocks < 0:
            raise InvalidRequestError(f"prefix cache blocks must be >= 0 (0 = off), got {self.prefix_cache_blocks}")
        if self.max_speculative_tokens < 1 or self.max_session_sequences < 1:
            raise InvalidRequestError("session limits (max K, sequences) must be >= 1")
        if self.ssd.backup_max_neural_batch < 0:
            raise InvalidRequestError(f"backup max neural batch must be >= 0, got {self.ssd.backup_max_neural_batch}")


def parse_args(argv: list[str] | None = None) -> DraftServiceConfig:
    env = os.environ
    p = argparse.ArgumentParser(prog="draft_service", description="ssd-serve draft (speculator) service")
    p.add_argument("--draft", default=env.get("SSD_DRAFT_MODEL", "ngram"))
    p.add_argument("--target-model", default=env.get("SSD_DRAFT_TARGET_MODEL") or None,
                   help="target checkpoint folder or known model name (needed by EAGLE-3 heads)")
    p.add_argument("--address", default=env.get("SSD_DRAFT_ADDRESS", "127.0.0.1:50052"))
    add_metrics_port_flag(p, env, "SSD_DRAFT_METRICS_PORT")
    add_config_flags(p, ENGINE_FIELDS, ENGINE_DEFAULTS, whose="the draft's", env=("SSD_DRAFT_", env),
                     overrides={"device": {"help": "where the draft runs: cpu, cuda or cuda:N"}})
    p.add_argument("--prefix-cache-blocks", type=int, default=int(env.get("SSD_DRAFT_PREFIX_CACHE_BLOCKS", "1024")),
                   help="an EAGLE-3 head's own prefix cache (head KV of shared prompt blocks), in blocks; 0 = off")
    add_config_flags(p.add_argument_group("SSD (neural drafts; sequences whose Prefill asks for ssd)"), SSD_FIELDS,
                     env=("SSD_DRAFT_", env))
    add_limit_flags(p, env)
    add_tls_flags(p, env)
    p.add_argument("--log-level", default=env.get("SSD_LOG_LEVEL", "info"))
    p.add_argument("--log-text", action="store_true", help="human-readable logs instead of JSON")
    a = p.parse_args(argv)
    try:
        engine = EngineConfig(a.draft, **options_from_args(a, ENGINE_FIELDS))
        return DraftServiceConfig(engine=engine, target_model=a.target_model, address=a.address,
                                  metrics_port=a.metrics_port, ssd=ssd_from_args(a),
                                  prefix_cache_blocks=a.prefix_cache_blocks, max_speculative_tokens=a.max_speculative_tokens,
                                  max_session_sequences=a.max_session_sequences, tls=tls_from_args(p, a),
                                  log_level=a.log_level, log_json=not a.log_text)
    except InvalidRequestError as e:
        p.error(str(e))  # exits 2 with the usage line


def add_limit_flags(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """What one session's peer may ask; a round past them is refused with INVALID_ARGUMENT."""
    g = p.add_argument_group("session limits (the draft trusts no target)")
    g.add_argument("--max-speculative-tokens", type=int,
                   default=int(env.get("SSD_DRAFT_MAX_SPECULATIVE_TOKENS", str(MAX_LOOKAHEAD))),
                   help="lookahead K a round may ask for at most")
    g.add_argument("--max-session-sequences", type=int, default=int(env.get("SSD_DRAFT_MAX_SESSION_SEQUENCES", "256")),
                   help="sequences one session may hold at once")
