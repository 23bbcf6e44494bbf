"""A tensor-parallel target service (the default model over 3 CPU ranks, float32): the OpenAI client gets the
offline engine's greedy text in ar and sd; a rank that dies makes the target fail its requests and exit."""

import os
import signal
from pathlib import Path

import openai
import pytest

from deploy.local import stop_stack
from tests.integration.conftest import API_KEY, PROMPTS, launch
from tests.integration.helpers import openai_client, stream_chat, wait_for

pytestmark = pytest.mark.model


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture(scope="module")
def tp_stack(tmp_path_factory, default_model_path):
    s = launch(tmp_path_factory, "tp", draft="ngram", k=3, tensor_parallel_size=3)  # 9 heads, 3 KV heads
    yield s
    stop_stack(s)


def test_sharded_target_serves_the_offline_greedy_text(tp_stack, offline_greedy):
    client = openai_client(tp_stack.url, API_KEY)
    for prompt in PROMPTS:
        assert stream_chat(client, prompt, 24, "ar")[0] == offline_greedy(prompt, 24)
        text, usage = stream_chat(client, prompt, 24, "sd")
        assert text == offline_greedy(prompt, 24) and usage["speculation"]["num_drafts"] > 0


def test_a_dead_rank_stops_the_target(tp_stack):
    target = tp_stack.child("target-0")
    workers = _children(target.proc.pid)
    assert len(workers) == 2  # ranks 1 and 2
    os.kill(workers[0], signal.SIGKILL)
    client = openai_client(tp_stack.url, API_KEY)
    with pytest.raises(openai.APIStatusError):
        stream_chat(client, PROMPTS[0], 8, "ar")
    assert wait_for(lambda: target.proc.poll() is not None, timeout_s=60)
    assert target.proc.returncode == 1
    assert wait_for(lambda: all(not Path(f"/proc/{w}").exists() for w in workers[1:]), timeout_s=30)
