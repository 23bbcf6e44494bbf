"""A client that goes away while waiting for a non-streaming answer frees the sequence's KV on the target and draft.

The request asks for far more tokens than could be generated in the test's time (2000, EOS ignored), so the
sequence can only leave the target that soon because the gateway cancelled it.
"""

import http.client
import json
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.integration.conftest import API_KEY
from tests.integration.helpers import draft_load, target_load, wait_for

pytestmark = pytest.mark.model

MAX_TOKENS = 2000


def generated_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:generation_tokens_total"))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_client_disconnect_cancels_a_nonstreaming_request(stack, path):
    target, draft = stack.target_addresses[0], stack.draft_address
    assert wait_for(lambda: target_load(target).num_running == 0 and target_load(target).num_used_kv_blocks == 0)
    tokens_before = generated_tokens(stack.url)
    body = {"model": "smollm2-135m-instruct", "max_tokens": MAX_TOKENS, "temperature": 0, "stream": False,
            "mode": "sd", "ignore_eos": True}
    body |= ({"messages": [{"role": "user", "content": "Tell me a long story."}]} if "chat" in path
             else {"prompt": "Once upon a time"})
    host = urlsplit(stack.url)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    try:  # the request is sent; nothing is read: the answer only comes when generation ends
        assert wait_for(lambda: target_load(target).num_running == 1, timeout_s=30, interval_s=0.1)
        time.sleep(1.0)  # it generates for a while
        load = draft_load(draft)  # one snapshot: the two fields must describe the same moment
        assert load.num_sequences == 1 and load.num_used_kv_blocks > 0
        assert target_load(target).num_used_kv_blocks > 0
    finally:
        conn.close()  # the client goes away
    closed_at = time.monotonic()
    assert wait_for(lambda: target_load(target).num_running == 0 and target_load(target).num_used_kv_blocks == 0,
                    timeout_s=15, interval_s=0.1)
    assert wait_for(lambda: draft_load(draft).num_sequences == 0 and draft_load(draft).num_used_kv_blocks == 0)
    freed_after_s = time.monotonic() - closed_at
    num_generated = generated_tokens(stack.url) - tokens_before
    assert num_generated < MAX_TOKENS / 2, f"{num_generated} tokens: the request ran on after the disconnect"
    assert freed_after_s < 15
