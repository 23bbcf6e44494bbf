"""The draft service's frozen config, built once from flags and environment (SSD_DRAFT_*)."""

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from rpc.metrics_http import add_metrics_port_flag
from rpc.tls_files import TlsFiles, add_tls_flags, tls_from_args
from ssd.cli_flags import add_dtype_flag, add_step_flags, step_options_from_args
from ssd.config import BACKUP_KINDS, DEVICE_PATTERN, FAN_OUT_KINDS, MAX_LOOKAHEAD, SsdConfig
from ssd.errors import InvalidRequestError


@dataclass(frozen=True)
class DraftServiceConfig:
    draft: str = "ngram"  # "ngram", a draft checkpoint or an EAGLE-3 head folder / known model name
    target_model: str | None = None  # the target checkpoint an EAGLE-3 head drafts for (its embedding + config)
    address: str = "127.0.0.1:50052"  # host:port to listen on
    metrics_port: int = 0  # Prometheus /metrics over HTTP on this port, on the host of `address`; 0 = off
    dtype: str = "float32"  # draft weights dtype
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N": where the draft runs
    num_threads: int = 1  # torch intra-op threads
    kv_cache_memory_mb: int = 256  # the draft's own KV budget
    block_size: int = 16  # tokens per draft KV block (an EAGLE-3 head's prefix-cache blocks: the target's size)
    prefix_cache_blocks: int = 1024  # an EAGLE-3 head's own prefix cache, in blocks; 0 = off
    compile: str = "auto"  # a draft model's torch.compile: auto | on | off (ssd/runtime/compile.py)
    enforce_eager: bool = False
    attention_backend: str = "auto"  # a draft model's attention: auto | torch | triton | flash-attn
    ngram_max: int = 3  # n-gram proposer: longest tail matched (also the SSD fast backup)
    ssd: SsdConfig = field(default_factory=SsdConfig)  # SSD defaults (a neural draft); a Round's SsdOptions override
    grace_s: float = 5.0  # drain time on SIGTERM
    # what a session's peer may ask (draft_service/limits.py); past these a round or a sequence is refused
    max_speculative_tokens: int = MAX_LOOKAHEAD  # lookahead K per round
    max_session_sequences: int = 256  # sequences one session holds
    max_model_len: int | None = None  # tokens per sequence; None = the draft model's positions
    tls: TlsFiles = field(default_factory=TlsFiles)  # server certificate; with a CA, targets must present one
    log_level: str = "info"
    log_json: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise InvalidRequestError(f"metrics port must be in [0, 65535] (0 = off), got {self.metrics_port}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise InvalidRequestError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.num_threads < 1 or self.kv_cache_memory_mb < 1 or self.block_size < 1:
            raise InvalidRequestError("threads, KV memory and block size must be >= 1")
        if self.prefix_cache_blocks < 0:
            raise InvalidRequestError(f"prefix cache blocks must be >= 0 (0 = off), got {self.prefix_cache_blocks}")
        if self.max_speculative_tokens < 1 or self.max_session_sequences < 1 or (self.max_model_len or 1) < 1:
            raise InvalidRequestError("session limits (max K, sequences, model length) must be >= 1")
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
    add_dtype_flag(p, default=env.get("SSD_DRAFT_DTYPE", "float32"), whose="the draft's")
    p.add_argument("--device", default=env.get("SSD_DRAFT_DEVICE", "cpu"), help="where the draft runs: cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=int(env.get("SSD_DRAFT_THREADS", "1")))
    p.add_argument("--kv-cache-mb", type=int, default=int(env.get("SSD_DRAFT_KV_MB", "256")))
    p.add_argument("--block-size", type=int, default=int(env.get("SSD_DRAFT_BLOCK_SIZE", "16")),
                   help="tokens per KV block; an EAGLE-3 head's prefix-cache blocks must match the target's")
    p.add_argument("--prefix-cache-blocks", type=int, default=int(env.get("SSD_DRAFT_PREFIX_CACHE_BLOCKS", "1024")),
                   help="an EAGLE-3 head's own prefix cache (head KV of shared prompt blocks), in blocks; 0 = off")
    add_ssd_flags(p, env)
    add_limit_flags(p, env)
    add_tls_flags(p, env)
    add_step_flags(p, compile_default=env.get("SSD_DRAFT_COMPILE", "auto"))
    p.add_argument("--log-level", default=env.get("SSD_LOG_LEVEL", "info"))
    p.add_argument("--log-text", action="store_true", help="human-readable logs instead of JSON")
    a = p.parse_args(argv)
    try:
        ssd = SsdConfig(fan_out_budget=a.fan_out_budget, fan_out=a.fan_out, backup=a.backup,
                        backup_max_neural_batch=a.backup_max_neural_batch, saguaro_c=a.saguaro_c,
                        backup_hits=a.backup_hits)
        return DraftServiceConfig(draft=a.draft, target_model=a.target_model, address=a.address, dtype=a.dtype,
                                  device=a.device, metrics_port=a.metrics_port,
                                  num_threads=a.threads, kv_cache_memory_mb=a.kv_cache_mb, ssd=ssd,
                                  prefix_cache_blocks=a.prefix_cache_blocks, block_size=a.block_size,
                                  max_speculative_tokens=a.max_speculative_tokens,
                                  max_session_sequences=a.max_session_sequences, max_model_len=a.max_model_len,
                                  tls=tls_from_args(p, a),
                                  **step_options_from_args(a),
                                  log_level=a.log_level, log_json=not a.log_text)
    except InvalidRequestError as e:
        p.error(str(e))  # exits 2 with the usage line


def add_ssd_flags(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """SSD defaults of a neural draft (SSD.md section 5); a target's Round.ssd overrides them per round."""
    g = p.add_argument_group("SSD (neural drafts; sequences whose Prefill asks for ssd)")
    g.add_argument("--fan-out-budget", type=int, default=int(env.get("SSD_DRAFT_FAN_OUT_BUDGET", "8")),
                   help="bonus-token guesses prepared per sequence and round (sum of the fan-out shape)")
    g.add_argument("--fan-out", default=env.get("SSD_DRAFT_FAN_OUT", "geometric"), choices=FAN_OUT_KINDS,
                   help="fan-out shape: geometric (from the measured acceptance) or uniform")
    g.add_argument("--backup", default=env.get("SSD_DRAFT_BACKUP", "auto"), choices=BACKUP_KINDS,
                   help="on a cache miss: neural (draft now), fast (n-gram lookup), auto (by batch size)")
    g.add_argument("--backup-max-neural-batch", type=int,
                   default=int(env.get("SSD_DRAFT_BACKUP_MAX_NEURAL_BATCH", "4")),
                   help="auto backup: neural up to this batch size, fast above")
    g.add_argument("--saguaro-c", type=float, default=float(env.get("SSD_DRAFT_SAGUARO_C", "1.0")),
                   help="Saguaro sampling constant C in (0, 1]; 1 = plain sampling")
    g.add_argument("--backup-hits", action="store_true", default=env.get("SSD_DRAFT_BACKUP_HITS", "") == "1",
                   help="a round with a neural backup re-drafts its hits too, in the same batched forwards")


def add_limit_flags(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """What one session's peer may ask; a round past them is refused with INVALID_ARGUMENT."""
    g = p.add_argument_group("session limits (the draft trusts no target)")
    g.add_argument("--max-speculative-tokens", type=int,
                   default=int(env.get("SSD_DRAFT_MAX_SPECULATIVE_TOKENS", str(MAX_LOOKAHEAD))),
                   help="lookahead K a round may ask for at most")
    g.add_argument("--max-session-sequences", type=int, default=int(env.get("SSD_DRAFT_MAX_SESSION_SEQUENCES", "256")),
                   help="sequences one session may hold at once")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="tokens per sequence at most (default: the draft model's positions)")
