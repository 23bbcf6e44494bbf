"""Command-line flags shared by `ssd generate`, `ssd bench` and the services: speculation settings."""

import argparse

from ssd.spec.config import SpeculationConfig
from ssd.spec.proposer import TreeShape


def add_speculation_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default="ngram", help="sd: 'ngram', a draft checkpoint / model name, or an EAGLE-3 head")
    p.add_argument("--k", type=int, default=4, help="lookahead K: draft tokens per round (tree: its depth)")
    p.add_argument("--tree", action="store_true", help="token-tree speculation instead of a chain")
    p.add_argument("--tree-budget", type=int, default=16, help="draft nodes per tree")
    p.add_argument("--tree-topk", type=int, default=2, help="children tried per expanded tree node")
    p.add_argument("--dtemp", type=float, default=None, help="draft sampling temperature (default: the target's)")


def tree_from_args(args: argparse.Namespace) -> TreeShape | None:
    return TreeShape(budget=args.tree_budget, depth=args.k, top_k=args.tree_topk) if args.tree else None


def speculation_from_args(args: argparse.Namespace, max_batch: int | None = None) -> SpeculationConfig:
    schedule = ((max_batch, args.k),) if max_batch else None
    return SpeculationConfig(draft=args.draft, num_speculative_tokens=args.k, tree=tree_from_args(args),
                             k_schedule=schedule)
