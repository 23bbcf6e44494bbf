"""`ssd serve` / `make demo` defaults: a neural draft's sd requests speculate 8-node token trees, n-gram chains."""

import argparse

from deploy.cli import add_serve_command, stack_config
from deploy.local import NEURAL_TREE_BUDGET, default_tree_budget
from ssd.model_store import DEFAULT_DRAFT


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_a_neural_draft_gets_trees_and_ngram_or_no_draft_chains():
    assert default_tree_budget(DEFAULT_DRAFT) == NEURAL_TREE_BUDGET == 8
    assert default_tree_budget("some/draft-model-folder") == 8
    assert default_tree_budget("ngram") == 0
    assert default_tree_budget(None) == 0


def test_serve_flags_pick_the_default_tree_budget_unless_given():
    assert stack_config(serve_args()).tree_budget == 8  # the shipped EAGLE-3 head
    assert stack_config(serve_args("--draft", "ngram")).tree_budget == 0
    assert stack_config(serve_args("--draft", "none")).draft is None
    assert stack_config(serve_args("--tree-budget", "0")).tree_budget == 0  # chains on request
    assert stack_config(serve_args("--draft", "ngram", "--tree-budget", "4")).tree_budget == 4
