"""Integration fixtures: the real services as processes on localhost (free ports, bounded start-up).

The main stack: a tiny random draft model (vocabulary of the default model, so it owns real draft KV),
one float32 target of the default model (exact greedy text), a gateway with an API key.
"""

from pathlib import Path

import pytest

from deploy.local import Stack, start_stack, stop_stack
from tests.integration.helpers import stack_config

API_KEY = "test-key"
PROMPTS = ["Write a haiku about the sea.", "What is 12 times 7? Answer briefly."]
MAX_TOKENS = 40


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory, default_model_path) -> Path:
    """A random draft with the default model's vocabulary and tokenizer (so it drafts under a request's grammar)."""
    import shutil

    from tests.tiny_models import write_tiny_checkpoint

    folder = tmp_path_factory.mktemp("tiny-draft")
    write_tiny_checkpoint(folder, "llama", vocab_size=49152, max_position_embeddings=8192)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, folder / name)
    return folder


def launch(tmp_path_factory, name: str, **overrides) -> Stack:  # noqa: ANN001, ANN003
    log_dir = tmp_path_factory.mktemp(f"logs-{name}")
    options = {"dtype": "float32", **overrides}
    config = stack_config(model="smollm2-135m-instruct", api_key=API_KEY, log_dir=log_dir,
                         http_port=_port(), grpc_port=_port(), **options)
    return start_stack(config, timeout_s=240)


def _port() -> int:
    from deploy.local import free_port

    return free_port()


@pytest.fixture(scope="session")
def stack(tmp_path_factory, tiny_draft, default_model_path) -> Stack:
    s = launch(tmp_path_factory, "main", draft=str(tiny_draft), k=3)
    yield s
    stop_stack(s)


class OfflineGreedy:
    """The offline engine's greedy chat output (float32), computed once per (prompt, max_tokens)."""

    def __init__(self, path: Path) -> None:
        from ssd.llm import LLM

        self.llm = LLM(str(path), dtype="float32", num_threads=1)
        self.cache: dict[tuple[str, int], str] = {}

    def __call__(self, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
        from ssd.sampling.params import SamplingParams

        key = (prompt, max_tokens)
        if key not in self.cache:
            text = self.llm.chat_prompt([{"role": "user", "content": prompt}])
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            self.cache[key] = self.llm.generate(text, params)[0].text
        return self.cache[key]


@pytest.fixture(scope="session")
def offline_greedy(default_model_path) -> OfflineGreedy:
    return OfflineGreedy(default_model_path)
