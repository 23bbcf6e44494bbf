"""A client that goes away mid-stream frees the sequence's KV on the target and the draft."""

import httpx
import pytest

from tests.integration.conftest import API_KEY
from tests.integration.helpers import draft_load, target_load, wait_for

pytestmark = pytest.mark.model


def test_client_cancel_frees_kv_on_target_and_draft(stack):
    target, draft = stack.target_addresses[0], stack.draft_address
    assert wait_for(lambda: target_load(target).num_running == 0)
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True, "mode": "sd", "ignore_eos": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        lines = 0
        for line in r.iter_lines():
            lines += bool(line.startswith("data:"))
            if lines >= 4:
                break
        assert target_load(target).num_used_kv_blocks > 0
        # one snapshot per poll (the two fields must describe the same moment); polled, since a draft session that
        # timed out on a loaded machine holds the sequence again only after the target reconnects
        assert wait_for(lambda: (lambda load: load.num_sequences == 1 and load.num_used_kv_blocks > 0)(
            draft_load(draft)))
    # the connection is closed: the gateway cancels the target call, the target aborts and releases the draft
    assert wait_for(lambda: target_load(target).num_used_kv_blocks == 0 and target_load(target).num_running == 0)
    assert wait_for(lambda: draft_load(draft).num_sequences == 0 and draft_load(draft).num_used_kv_blocks == 0)
