"""The draft service's frozen config, built once from flags and environment (SSD_DRAFT_*)."""

import argparse
import os
from dataclasses import dataclass

from ssd.errors import InvalidRequestError


@dataclass(frozen=True)
class DraftServiceConfig:
    draft: str = "ngram"  # "ngram", a draft checkpoint or an EAGLE-3 head folder / known model name
    target_model: str | None = None  # the target checkpoint an EAGLE-3 head drafts for (its embedding + config)
    address: str = "127.0.0.1:50052"  # host:port to listen on
    dtype: str = "float32"  # draft weights dtype
    num_threads: int = 1  # torch intra-op threads
    kv_cache_memory_mb: int = 256  # the draft's own KV budget
    block_size: int = 16  # tokens per draft KV block
    ngram_max: int = 3  # n-gram proposer: longest tail matched
    grace_s: float = 5.0  # drain time on SIGTERM
    log_level: str = "info"
    log_json: bool = True

    def __post_init__(self) -> None:
        if self.num_threads < 1 or self.kv_cache_memory_mb < 1 or self.block_size < 1:
            raise InvalidRequestError("threads, KV memory and block size must be >= 1")


def parse_args(argv: list[str] | None = None) -> DraftServiceConfig:
    env = os.environ
    p = argparse.ArgumentParser(prog="draft_service", description="ssd-serve draft (speculator) service")
    p.add_argument("--draft", default=env.get("SSD_DRAFT_MODEL", "ngram"))
    p.add_argument("--target-model", default=env.get("SSD_DRAFT_TARGET_MODEL") or None,
                   help="target checkpoint folder or known model name (needed by EAGLE-3 heads)")
    p.add_argument("--address", default=env.get("SSD_DRAFT_ADDRESS", "127.0.0.1:50052"))
    p.add_argument("--dtype", default=env.get("SSD_DRAFT_DTYPE", "float32"), choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=int(env.get("SSD_DRAFT_THREADS", "1")))
    p.add_argument("--kv-cache-mb", type=int, default=int(env.get("SSD_DRAFT_KV_MB", "256")))
    p.add_argument("--log-level", default=env.get("SSD_LOG_LEVEL", "info"))
    p.add_argument("--log-text", action="store_true", help="human-readable logs instead of JSON")
    a = p.parse_args(argv)
    return DraftServiceConfig(draft=a.draft, target_model=a.target_model, address=a.address, dtype=a.dtype,
                              num_threads=a.threads, kv_cache_memory_mb=a.kv_cache_mb, log_level=a.log_level,
                              log_json=not a.log_text)
