"""Shared fixtures of the speculation tests: a tiny float32 target and an unrelated one-layer draft."""

import pytest

from tests.tiny_models import write_tiny_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory):  # noqa: ANN201
    """(target, draft) folders: random tiny Llamas, the draft with other weights and one layer."""
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_checkpoint(draft, "llama", seed=1, num_hidden_layers=1)
    return target, draft
