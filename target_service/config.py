"""The target service's frozen config, built once from flags and environment (SSD_TARGET_*)."""

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from rpc.metrics_http import add_metrics_port_flag
from rpc.tls_files import TlsFiles, add_tls_flags, tls_from_args
from ssd.cli_flags import STEP_FIELDS, add_config_flags, options_from_args
from ssd.config import DecodeMode, EngineConfig, ProposerChoice, SpeculationConfig, TreeShape, parse_enum
from ssd.errors import InvalidRequestError
from ssd.model_store import DEFAULT_MODEL

# the engine settings the service takes as flags (generated from ssd/cli_flags.py CONFIG_FLAGS, SSD_TARGET_* defaults)
ENGINE_FIELDS = ("dtype", "quantization", "device", "num_threads", "tensor_parallel_size", "kv_cache_memory_mb",
                 "max_num_seqs", "prefill_chunk_tokens", "max_model_len", "block_size", "enable_prefix_caching",
                 *STEP_FIELDS)
ENGINE_DEFAULTS = {"num_threads": 1, "kv_cache_memory_mb": 512}  # where the service's defaults are not the engine's


def remote_speculation(k: int, tree: TreeShape | None, max_num_seqs: int) -> SpeculationConfig:
    """The speculation of a target whose proposals come from draft services: K at every batch size."""
    return SpeculationConfig(ProposerChoice("remote"), num_speculative_tokens=k, tree=tree,
                             k_schedule=((max_num_seqs, k),))


@dataclass(frozen=True)
class TargetServiceConfig:
    # the target's engine (model, dtype, device, threads, KV, batch, step settings); its speculation is `speculation`
    # below, set when a draft is connected
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(DEFAULT_MODEL, **ENGINE_DEFAULTS))
    address: str = "127.0.0.1:50051"  # host:port to listen on
    metrics_port: int = 0  # Prometheus /metrics over HTTP on this port, on the host of `address`; 0 = off
    replica_id: str = "target-0"  # names this replica in logs and on the draft session
    draft_addresses: tuple[str, ...] = ()  # the draft services (sequences spread over them); () = every request ar
    # how requests speculate once a draft is connected: K (a tree's depth), sd requests' token tree (None = chains;
    # ssd requests always speculate chains), K at every batch size up to max_num_seqs; proposals come from the drafts
    speculation: SpeculationConfig = field(default_factory=lambda: remote_speculation(4, None, 16))
    default_mode: DecodeMode = DecodeMode.SD  # mode of requests that name none (sd and ssd need a draft)
    # requests that name no mode speculate (in default_mode) only in batches where the engine measured speculation
    # faster than plain steps, as mode auto does (ssd/engine/mode_choice.py); False: they always speculate
    adaptive: bool = False
    draft_timeout_s: float = 5.0  # a round without an answer within this breaks the session (AR fallback)
    draft_feature_layers: tuple[int, ...] | None = None  # layers whose features the draft needs; None = ask it
    draft_info_timeout_s: float = 60.0  # start-up wait for the draft's GetInfo (its feature layers)
    tensor_transport: str = "auto"  # "auto": CUDA IPC / shared memory when the draft shares this node; "inline"
    reconnect_interval_s: float = 0.5  # between attempts to (re)open the draft session
    grace_s: float = 10.0  # drain time on SIGTERM
    log_level: str = "info"
    log_json: bool = True
    # reliability (issue 31): admission limits past which Generate is RESOURCE_EXHAUSTED, and TLS
    max_waiting_seqs: int = 64  # admitted requests not yet running (beyond max_num_seqs running)
    max_queued_tokens: int = 65536  # prompt tokens of the waiting requests
    tls: TlsFiles = field(default_factory=TlsFiles)  # server certificate + client CA; the draft hop's client side

    @property
    def draft_address(self) -> str | None:
        """The first draft service (None: no draft)."""
        return self.draft_addresses[0] if self.draft_addresses else None

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise InvalidRequestError(f"metrics port must be in [0, 65535] (0 = off), got {self.metrics_port}")
        if self.max_waiting_seqs < 0 or self.max_queued_tokens < 1:
            raise InvalidRequestError("max waiting sequences must be >= 0 and max queued tokens >= 1")
        if self.tensor_transport not in ("auto", "inline"):
            raise InvalidRequestError(f"tensor transport must be 'auto' or 'inline', got {self.tensor_transport!r}")
        object.__setattr__(self, "default_mode", parse_enum(DecodeMode, self.default_mode, "default mode"))
        if self.draft_timeout_s <= 0 or self.draft_info_timeout_s <= 0:
            raise InvalidRequestError("draft timeouts must be > 0")
        if self.draft_feature_layers is not None and any(layer < 0 for layer in self.draft_feature_layers):
            raise InvalidRequestError(f"feature layers must be >= 0, got {self.draft_feature_layers}")


def parse_feature_layers(text: str) -> tuple[int, ...] | None:
    """'auto' -> None (ask the draft), 'none' or '' -> (), '2,15,27' -> (2, 15, 27)."""
    text = text.strip().lower()
    if text == "auto":
        return None
    if text in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"takes 'auto', 'none' or layer numbers like '2,15,27', got {text!r}") from e


def draft_addresses(flags: list[str] | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """The repeated --draft-address flags, else SSD_DRAFT_ADDRESS split at commas; duplicates dropped."""
    given = flags if flags is not None else env.get("SSD_DRAFT_ADDRESS", "").split(",")
    return tuple(dict.fromkeys(a.strip() for a in given if a.strip()))


def parse_args(argv: list[str] | None = None) -> TargetServiceConfig:
    env = os.environ
    p = argparse.ArgumentParser(prog="target_service", description="ssd-serve target (verifier) service")
    p.add_argument("--model", default=env.get("SSD_TARGET_MODEL", DEFAULT_MODEL))
    p.add_argument("--address", default=env.get("SSD_TARGET_ADDRESS", "127.0.0.1:50051"))
    p.add_argument("--replica-id", default=env.get("SSD_TARGET_REPLICA", "target-0"))
    add_metrics_port_flag(p, env, "SSD_TARGET_METRICS_PORT")
    add_config_flags(p, ENGINE_FIELDS, ENGINE_DEFAULTS, whose="the target's", env=("SSD_TARGET_", env))
    p.add_argument("--draft-address", action="append", dest="draft_addresses", default=None,
                   help="host:port of a draft service; repeat it for several drafts (sequences spread over the "
                        "healthy ones, least loaded first; a dead draft's sequences move to another); default: "
                        "SSD_DRAFT_ADDRESS (comma-separated); omit for ar only")
    p.add_argument("--k", type=int, default=4, help="lookahead K (a token tree's depth)")
    p.add_argument("--tree-budget", type=int, default=int(env.get("SSD_TARGET_TREE_BUDGET", "0")),
                   help="sd requests speculate token trees of this many draft nodes (0 = chains; ssd stays chains)")
    p.add_argument("--tree-topk", type=int, default=2, help="children tried per expanded tree node")
    p.add_argument("--default-mode", default=env.get("SSD_TARGET_DEFAULT_MODE", DecodeMode.SD), type=DecodeMode,
                   choices=list(DecodeMode),
                   help="mode of requests that name none (sd and ssd need --draft-address)")
    p.add_argument("--adaptive", action=argparse.BooleanOptionalAction,
                   default=env.get("SSD_TARGET_ADAPTIVE", "0").lower() in ("1", "true", "yes"),
                   help="requests that name no mode speculate only in batches where the target measured it faster "
                        "than plain steps (as mode auto); a request's own mode still forces it")
    p.add_argument("--draft-timeout-s", type=float, default=5.0)
    p.add_argument("--draft-feature-layers", type=parse_feature_layers,
                   default=env.get("SSD_TARGET_DRAFT_FEATURE_LAYERS", "auto"),
                   help="target layers whose features the draft needs (EAGLE-3): 'auto' asks the draft at "
                        "start-up, 'none', or e.g. '2,15,27'")
    p.add_argument("--draft-info-timeout-s", type=float, default=60.0,
                   help="with 'auto' feature layers: how long start-up waits for the draft to answer")
    p.add_argument("--tensor-transport", default=env.get("SSD_TARGET_TENSOR_TRANSPORT", "auto"),
                   choices=["auto", "inline"],
                   help="tensors to / from the draft: CUDA IPC (both on one GPU node) or shared memory (one node), "
                        "else inline; or always inline")
    p.add_argument("--log-level", default=env.get("SSD_LOG_LEVEL", "info"))
    p.add_argument("--log-text", action="store_true", help="human-readable logs instead of JSON")
    p.add_argument("--max-waiting-seqs", type=int, default=int(env.get("SSD_TARGET_MAX_WAITING_SEQS", "64")),
                   help="admitted requests waiting to run at most; past it Generate is RESOURCE_EXHAUSTED")
    p.add_argument("--max-queued-tokens", type=int, default=int(env.get("SSD_TARGET_MAX_QUEUED_TOKENS", "65536")),
                   help="prompt tokens of the waiting requests at most; past it Generate is RESOURCE_EXHAUSTED")
    add_tls_flags(p, env)
    a = p.parse_args(argv)
    return TargetServiceConfig(
        engine=EngineConfig(a.model, **options_from_args(a, ENGINE_FIELDS)),
        max_waiting_seqs=a.max_waiting_seqs, max_queued_tokens=a.max_queued_tokens, tls=tls_from_args(p, a),
        address=a.address, metrics_port=a.metrics_port, replica_id=a.replica_id,
        draft_addresses=draft_addresses(a.draft_addresses, env), default_mode=a.default_mode, adaptive=a.adaptive,
        speculation=remote_speculation(a.k, TreeShape(a.tree_budget, a.k, a.tree_topk) if a.tree_budget else None,
                                       a.max_num_seqs),
        draft_timeout_s=a.draft_timeout_s, draft_feature_layers=a.draft_feature_layers,
        draft_info_timeout_s=a.draft_info_timeout_s, tensor_transport=a.tensor_transport, log_level=a.log_level,
        log_json=not a.log_text)
