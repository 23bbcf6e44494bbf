"""Command-line flags shared by `ssd generate`, `ssd bench` and the services: dtype, step and speculation settings."""

import argparse

from ssd.config import (
    ATTENTION_BACKENDS,
    BACKUP_KINDS,
    COMPILE_MODES,
    FAN_OUT_KINDS,
    SpeculationConfig,
    SsdConfig,
    TreeShape,
)
from ssd.model_store import DEFAULT_DRAFT


def add_dtype_flag(p: argparse.ArgumentParser, default: str = "auto", whose: str = "the model's",
                   extra_choices: tuple[str, ...] = ()) -> None:
    """--dtype: auto (ssd/dtypes.py), float32 or bfloat16 (plus `extra_choices`)."""
    p.add_argument("--dtype", default=default, choices=["auto", "float32", "bfloat16", *extra_choices],
                   help=f"{whose} dtype; auto: bfloat16 on a GPU or a CPU with native bfloat16 matmuls, float32 "
                        f"elsewhere (default {default})")


def add_step_flags(p: argparse.ArgumentParser, compile_default: str = "auto") -> None:
    """--compile, --enforce-eager and --attention-backend: how the model forward runs (EngineConfig's fields)."""
    p.add_argument("--compile", default=compile_default, choices=COMPILE_MODES,
                   help="torch.compile the model forward (on: the first start compiles for minutes, later ones "
                        "read the cache); auto: where it measured faster, so far nowhere (default "
                        f"{compile_default})")
    p.add_argument("--enforce-eager", action="store_true", help="run every forward eager (no compile, no graphs)")
    p.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                   help="attention kernel; auto: flash-attn or triton on CUDA where installed, torch elsewhere")


def step_options_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The EngineConfig fields `add_step_flags` set, as keyword arguments."""
    return {"compile": args.compile, "enforce_eager": args.enforce_eager, "attention_backend": args.attention_backend}


def add_speculation_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="sd / ssd: the shipped EAGLE-3 head (default), 'ngram', a draft checkpoint / model name, "
                        "or an EAGLE-3 head folder")
    p.add_argument("--k", type=int, default=4, help="lookahead K: draft tokens per round (tree: its depth)")
    p.add_argument("--tree", action="store_true", help="token-tree speculation instead of a chain")
    p.add_argument("--tree-budget", type=int, default=8,
                   help="draft nodes per tree (8: the fastest SD shape measured with the shipped head)")
    p.add_argument("--tree-topk", type=int, default=2, help="children tried per expanded tree node")
    p.add_argument("--dtemp", type=float, default=None, help="draft sampling temperature (default: the target's)")
    g = p.add_argument_group("ssd (speculative speculative decoding)")
    g.add_argument("--f", type=int, default=SsdConfig.fan_out_budget, dest="fan_out_budget",
                   help="bonus-token guesses the draft prepares per sequence and round (fan-out budget)")
    g.add_argument("--fan-out", default=SsdConfig.fan_out, choices=FAN_OUT_KINDS,
                   help="fan-out shape over acceptance lengths: geometric (from measured acceptance) or uniform")
    g.add_argument("--backup", default=SsdConfig.backup, choices=BACKUP_KINDS,
                   help="on a cache miss: neural (draft now), fast (n-gram lookup), auto (by batch size)")
    g.add_argument("--saguaro-c", type=float, default=SsdConfig.saguaro_c,
                   help="Saguaro sampling: scale the draft's top-F probabilities by C in (0, 1] (1 = off)")
    g.add_argument("--backup-hits", action="store_true",
                   help="a round with a neural backup re-drafts its cache hits too, in the same forwards")


def tree_from_args(args: argparse.Namespace) -> TreeShape | None:
    return TreeShape(budget=args.tree_budget, depth=args.k, top_k=args.tree_topk) if args.tree else None


def ssd_from_args(args: argparse.Namespace) -> SsdConfig:
    return SsdConfig(fan_out_budget=args.fan_out_budget, fan_out=args.fan_out, backup=args.backup,
                     saguaro_c=args.saguaro_c, backup_hits=args.backup_hits)


def speculation_from_args(args: argparse.Namespace, max_batch: int | None = None,
                          is_ssd: bool = False) -> SpeculationConfig:
    schedule = ((max_batch, args.k),) if max_batch else None
    return SpeculationConfig(draft=args.draft, num_speculative_tokens=args.k, tree=tree_from_args(args),
                             k_schedule=schedule, ssd=ssd_from_args(args) if is_ssd else None)
