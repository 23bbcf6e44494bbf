"""Failures of model services: a dying draft never fails a request; a dying target is routed around."""

import signal
import threading
import time

import httpx
import pytest

from deploy.local import start_draft, stop_stack, wait_healthy
from tests.integration.conftest import API_KEY, launch
from tests.integration.helpers import openai_client, stream_chat, target_load, wait_for

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def ngram_stack(tmp_path_factory, default_model_path):
    s = launch(tmp_path_factory, "ngram", draft="ngram", k=4)
    yield s
    stop_stack(s)


def test_draft_killed_mid_generation(ngram_stack, offline_greedy):
    stack = ngram_stack
    client = openai_client(stack.url, API_KEY)
    prompt, max_tokens = "Count from one to thirty in words, separated by commas.", 64
    expected = offline_greedy(prompt, max_tokens)
    draft = stack.child("draft")
    chunks = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, extra_body={"mode": "sd"})
    text = []
    for i, chunk in enumerate(chunks):
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if i == 3:
            draft.proc.send_signal(signal.SIGKILL)  # mid-generation
    draft.proc.wait()
    assert "".join(text) == expected
    target = stack.target_addresses[0]
    assert wait_for(lambda: not target_load(target).is_draft_connected)
    # later requests succeed (AR fallback), with the same greedy text
    assert stream_chat(client, prompt, max_tokens, "sd")[0] == expected
    # the draft comes back on the same address: the target reconnects and speculates again
    stack.children.remove(draft)
    new = start_draft(stack, core=None)
    wait_healthy([new], 120)
    assert wait_for(lambda: target_load(target).is_draft_connected, timeout_s=30)
    text, usage = stream_chat(client, prompt, max_tokens, "sd")
    assert text == expected and usage["speculation"]["num_drafts"] > 0


def test_target_killed_requests_go_to_the_other(tmp_path_factory, default_model_path):
    # a slow health poll: the gateway learns of the dead target from a failed call, not from polling
    stack = launch(tmp_path_factory, "two-targets", draft=None, num_targets=2, dtype="bfloat16",
                   health_interval_s=60.0)
    try:
        client = openai_client(stack.url, API_KEY)
        assert stream_chat(client, "Hi!", 3)[1]["completion_tokens"] > 0

        def gateway_sees_both() -> bool:  # its first poll may predate a slow replica's start (next poll in 60 s)
            text = httpx.get(stack.url + "/metrics").text
            return all(f'ssd_replica_healthy{{replica="{a}"}} 1.0' in text for a in stack.target_addresses)

        assert wait_for(gateway_sees_both, timeout_s=90)
        victim = stack.child("target-0")
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        for i in range(10):  # different prompt prefixes hash to both replicas
            text, usage = stream_chat(client, f"Request {i}: name a color.", 3)
            assert usage["completion_tokens"] > 0
        metrics = httpx.get(stack.url + "/metrics").text
        retries = [line for line in metrics.splitlines() if line.startswith("ssd_request_retries_total")]
        assert retries and float(retries[0].split()[-1]) >= 1
        assert f'ssd_replica_healthy{{replica="{stack.target_addresses[0]}"}} 0.0' in metrics
        # while one request runs on the survivor, another arrives: both complete there
        results = []
        worker = threading.Thread(target=lambda: results.append(stream_chat(client, "Tell a joke.", 16)))
        worker.start()
        time.sleep(0.2)
        results.append(stream_chat(client, "Name a fruit.", 4))
        worker.join(120)
        assert len(results) == 2 and all(u["completion_tokens"] > 0 for _, u in results)
        # SIGTERM drains: a running request completes, then the replica stops serving and exits 0. The request is
        # long (256 tokens, EOS ignored) so that the poll below sees it running however fast the step is.
        survivor = stack.child("target-1")
        results.clear()
        worker = threading.Thread(
            target=lambda: results.append(stream_chat(client, "Tell a joke.", 256, ignore_eos=True)))
        worker.start()
        assert wait_for(lambda: target_load(survivor.address).num_running == 1, timeout_s=30)
        survivor.proc.send_signal(signal.SIGTERM)
        worker.join(120)
        assert results and results[0][1]["completion_tokens"] > 0
        assert survivor.proc.wait(30) == 0
    finally:
        stop_stack(stack)
