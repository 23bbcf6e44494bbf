"""Shared fixtures: tiny random checkpoints, and the real default model when it is cached."""

import os

import pytest
import torch

# Without a GPU the Triton kernels (ssd_kernels/, tests/kernels) run in Triton's CPU interpreter. Triton reads the
# flag when it is first imported (it decorates its own helpers then), and any test module may import it early
# (through torch._dynamo, or the engine through ssd_kernels/), so it is set here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.letter_models import write_letter_models
from tests.tiny_models import write_tiny_checkpoint


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tests run single-threaded: tiny ops gain nothing from threads, and a busy second core stalls them."""
    torch.set_num_threads(1)


@pytest.fixture
def torch_layer_ops():
    """The layers on their plain torch ops for one test (the project's CPU layer ops off)."""
    from ssd.layers import cpu_kernels

    cpu_kernels.set_layer_ops(False)
    yield
    cpu_kernels.set_layer_ops(True)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_checkpoint(folder, "llama")
    return folder


@pytest.fixture(scope="session")
def letters(tmp_path_factory):
    """(target folder, draft folder, target HF model in float64): tiny Llamas over the letter tokenizer."""
    target, draft = tmp_path_factory.mktemp("letters-target"), tmp_path_factory.mktemp("letters-draft")
    return target, draft, write_letter_models(target, draft)


@pytest.fixture(scope="session")
def default_model_path():
    from ssd.errors import ModelNotFoundError
    from ssd.model_store import DEFAULT_MODEL, resolve_model

    try:
        return resolve_model(DEFAULT_MODEL)
    except ModelNotFoundError:
        pytest.fail("the default model is not cached: run `make model` (or `ssd models pull smollm2-135m-instruct`)")
