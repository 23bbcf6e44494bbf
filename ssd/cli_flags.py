"""Command-line flags of every entry point that builds an engine (`ssd generate`, `ssd bench`, `ssd serve`, the
services, draft training): tables of EngineConfig's and SsdConfig's fields from which each parser's flags are
generated (a new setting is one field plus one row), plus the speculation flags."""

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ssd.config import (
    ATTENTION_BACKENDS,
    COMPILE_MODES,
    QUANTIZATION_CHOICES,
    QUANTIZATION_PATTERN,
    Backup,
    DecodeMode,
    EngineConfig,
    FanOut,
    ProposerChoice,
    SpeculationConfig,
    SsdConfig,
    TreeShape,
)
from ssd.model_store import DEFAULT_DRAFT


def _quantization(value: str) -> str:
    if not QUANTIZATION_PATTERN.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not one of {', '.join(QUANTIZATION_CHOICES)}, int4:32, int4:64, int4:128, int4:256")
    return value


@dataclass(frozen=True)
class ConfigFlag:
    """How one config field is spelled on the command line; `help` may name {whose} and {default}."""

    names: tuple[str, ...]  # the flag and its aliases
    help: str | None = None
    type: Callable[[str], object] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    env: str | None = None  # a service reads its default from SSD_<SERVICE>_<env>
    action: str | None = None  # "store_true" (a switch) or "store_false" (a --no-... switch)


CONFIG_FLAGS: dict[str, ConfigFlag] = {  # EngineConfig's fields
    "dtype": ConfigFlag(("--dtype",), "{whose} dtype; auto: bfloat16 on a GPU or a CPU with native bfloat16 matmuls, "
                        "float32 elsewhere (default {default})", choices=("auto", "float32", "bfloat16"), env="DTYPE"),
    "quantization": ConfigFlag(
        ("--quantization",), "{whose} linear weights: none (float); auto (the checkpoint's own quantization, e.g. the "
        "default model's Q4_1 GGUF weights, else none); int8 (per channel, quantized at load); int4 (the checkpoint's "
        "own 4-bit weights, else quantized at load in groups of 32); int4:G (quantized at load in groups of G = 32, "
        "64, 128 or 256, unless the checkpoint's own groups are G) (default {default})",
        type=_quantization, metavar="{none,auto,int8,int4,int4:G}", env="QUANTIZATION"),
    "device": ConfigFlag(("--device",), "where the model runs: cpu, cuda or cuda:N", env="DEVICE"),
    "num_threads": ConfigFlag(("--threads",), "torch intra-op threads (default {default})", int, env="THREADS"),
    "tensor_parallel_size": ConfigFlag(
        ("--tensor-parallel-size", "--tp"), "shard the model over this many CPU ranks (processes), each on its own "
        "cores and with --threads threads", int, env="TENSOR_PARALLEL_SIZE"),
    "kv_cache_memory_mb": ConfigFlag(("--kv-cache-mb",), "KV cache budget in MB (default {default})", int, env="KV_MB"),
    "max_num_seqs": ConfigFlag(("--max-num-seqs",), "sequences in one batch at most", int),
    "prefill_chunk_tokens": ConfigFlag(
        ("--prefill-chunk-tokens",), "while requests decode, feed a new prompt this many tokens per step, the "
        "decoding requests stepping in between (0 = whole prompts first)", int, env="PREFILL_CHUNK"),
    "max_model_len": ConfigFlag(("--max-model-len",), "tokens per sequence at most (default: the model's limit)", int),
    "block_size": ConfigFlag(("--block-size",), "tokens per KV block, the prefix cache's unit (an EAGLE-3 head's "
                             "draft service: the target's value)", int, env="BLOCK_SIZE"),
    "enable_prefix_caching": ConfigFlag(("--no-prefix-caching",), "compute every prompt token's KV (no reuse of "
                                        "shared prompt blocks; for comparisons)", action="store_false"),
    "compile": ConfigFlag(("--compile",), "torch.compile the model forward (on: the first start compiles for "
                          "minutes, later ones read the cache); auto: where it measured faster, so far nowhere "
                          "(default {default})", choices=COMPILE_MODES, env="COMPILE"),
    "enforce_eager": ConfigFlag(("--enforce-eager",), "run every forward eager (no compile, no graphs)",
                                action="store_true"),
    "attention_backend": ConfigFlag(("--attention-backend",), "attention kernel; auto: flash-attn or triton on CUDA "
                                    "where installed, cpu (the project's C++ op) on an AVX2 CPU, torch elsewhere",
                                    choices=ATTENTION_BACKENDS),
    # SsdConfig's fields (SSD.md section 5)
    "fan_out_budget": ConfigFlag(("--fan-out-budget", "--f"), "bonus-token guesses the draft prepares per sequence "
                                 "and round (sum of the fan-out shape)", int, env="FAN_OUT_BUDGET"),
    "fan_out": ConfigFlag(("--fan-out",), "fan-out shape over acceptance lengths: geometric (from the measured "
                          "acceptance) or uniform", FanOut, choices=tuple(FanOut), env="FAN_OUT"),
    "backup": ConfigFlag(("--backup",), "on a cache miss: neural (draft now), fast (n-gram lookup), auto (by batch "
                         "size)", Backup, choices=tuple(Backup), env="BACKUP"),
    "backup_max_neural_batch": ConfigFlag(("--backup-max-neural-batch",), "auto backup: neural up to this batch "
                                          "size, fast above", int, env="BACKUP_MAX_NEURAL_BATCH"),
    "saguaro_c": ConfigFlag(("--saguaro-c",), "Saguaro sampling: scale the draft's top-F probabilities by C in "
                            "(0, 1] (1 = off)", float, env="SAGUARO_C"),
    "backup_hits": ConfigFlag(("--backup-hits",), "a round that waits for a neural backup re-drafts its cache hits "
                              "too, in the same batched forwards (from the target's features)", action="store_true"),
    "round_hit_floor": ConfigFlag(("--round-hit-floor",), "neural backup: a round of several sequences builds "
                                  "caches only if all of them hit at least this likely, else drafts them now as SD "
                                  "(0 = always build)", float, env="ROUND_HIT_FLOOR"),
    "fit_fan_out": ConfigFlag(("--fixed-fan-out",), "prepare the whole --fan-out-budget every round, even where the "
                              "build then outlasts the verify (default: fit each round's budget, up to it, so that "
                              "the build ends before the next answer is asked for)", action="store_false",
                              env="FIT_FAN_OUT"),
}
STEP_FIELDS = ("compile", "enforce_eager", "attention_backend")  # how the model forward runs
SSD_FIELDS = ("fan_out_budget", "fan_out", "backup", "backup_max_neural_batch", "saguaro_c", "backup_hits",
              "round_hit_floor", "fit_fan_out")
_DEFAULTS = {f.name: f.default for config in (EngineConfig, SsdConfig) for f in dataclasses.fields(config)}


def add_config_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup, fields: Iterable[str],
                     defaults: Mapping[str, object] | None = None, whose: str = "the model's",
                     env: tuple[str, Mapping[str, str]] | None = None,
                     overrides: Mapping[str, Mapping[str, object]] | None = None) -> None:
    """The flags of these EngineConfig / SsdConfig `fields` (dest = the field name). `defaults` replaces the
    config's, `env` = (prefix, environment) lets a service's variables (prefix + ConfigFlag.env) replace those,
    and `overrides` replaces add_argument keyword arguments of single flags."""
    for name in fields:
        flag = CONFIG_FLAGS[name]
        default = (defaults or {}).get(name, _DEFAULTS[name])
        if env is not None and flag.env is not None:
            default = env[1].get(env[0] + flag.env, default)
        kwargs: dict[str, object] = {"dest": name, "help": flag.help and flag.help.format(whose=whose, default=default)}
        if flag.action is not None:
            kwargs["action"] = flag.action
            if isinstance(default, str):  # a switch's variable: 1 / true / yes / on, anything else off
                kwargs["default"] = default.strip().lower() in ("1", "true", "yes", "on")
        else:
            metavar = flag.metavar or (None if flag.choices else flag.names[0].lstrip("-").upper().replace("-", "_"))
            kwargs.update(default=default, type=flag.type, choices=flag.choices, metavar=metavar)
        kwargs.update((overrides or {}).get(name, {}))
        p.add_argument(*flag.names, **kwargs)


def options_from_args(args: argparse.Namespace, fields: Iterable[str]) -> dict[str, object]:
    """The config fields `add_config_flags` set, as keyword arguments."""
    return {name: getattr(args, name) for name in fields}


def config_flag_args(config: EngineConfig | SsdConfig, fields: Iterable[str]) -> list[str]:
    """The command line that gives a service these `fields` of `config` (what `add_config_flags` parses back)."""
    args: list[str] = []
    for name in fields:
        flag, value = CONFIG_FLAGS[name], getattr(config, name)
        if flag.action is None and value is not None:
            args += [flag.names[0], str(value)]
        elif (flag.action == "store_true" and value) or (flag.action == "store_false" and not value):
            args.append(flag.names[0])
    return args


def add_speculation_flags(p: argparse.ArgumentParser,
                          ssd_fields: Iterable[str] = SSD_FIELDS) -> None:
    """--draft, --k, the tree shape, --dtemp, and these SSD settings."""
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="sd / ssd: the shipped EAGLE-3 head (default), 'ngram', a draft checkpoint / model name, "
                        "or an EAGLE-3 head folder")
    p.add_argument("--k", type=int, default=4, help="lookahead K: draft tokens per round (tree: its depth)")
    p.add_argument("--tree", action="store_true", help="token-tree speculation instead of a chain")
    p.add_argument("--tree-budget", type=int, default=8,
                   help="draft nodes per tree (8: the fastest SD shape measured with the shipped head)")
    p.add_argument("--tree-topk", type=int, default=2, help="children tried per expanded tree node")
    p.add_argument("--dtemp", type=float, default=None, help="draft sampling temperature (default: the target's)")
    add_config_flags(p.add_argument_group("ssd (speculative speculative decoding)"), ssd_fields)


def tree_from_args(args: argparse.Namespace) -> TreeShape | None:
    return TreeShape(budget=args.tree_budget, depth=args.k, top_k=args.tree_topk) if args.tree else None


def ssd_from_args(args: argparse.Namespace) -> SsdConfig:
    return SsdConfig(**options_from_args(args, SSD_FIELDS))  # type: ignore[arg-type]


def speculation_from_args(args: argparse.Namespace, mode: DecodeMode,
                          max_batch: int | None = None) -> SpeculationConfig | None:
    """The speculation settings of `mode` (None for AR)."""
    if mode is DecodeMode.AR:
        return None
    schedule = ((max_batch, args.k),) if max_batch else None
    return SpeculationConfig(ProposerChoice(args.draft), num_speculative_tokens=args.k, tree=tree_from_args(args),
                             k_schedule=schedule, ssd=ssd_from_args(args) if mode is DecodeMode.SSD else None)
