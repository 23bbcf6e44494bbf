"""Deadlines reach the draft: a request whose timeout passes ends 504 (DEADLINE_EXCEEDED) and both services'
KV returns to its baseline; a sequence whose Prefill's time left passes is dropped by the draft by itself, even
without a Release, and an Outcome naming it afterwards is answered DEADLINE_EXCEEDED."""

import queue

import grpc
import httpx
import pytest

from protos.ssd.v1 import draft_pb2, draft_pb2_grpc
from tests.integration.conftest import API_KEY
from tests.integration.helpers import draft_load, target_load, wait_for

pytestmark = pytest.mark.model


def test_a_request_past_its_timeout_is_504_and_frees_kv_on_both_services(stack):
    target, draft = stack.target_addresses[0], stack.draft_address
    assert wait_for(lambda: draft_load(draft).num_sequences == 0 and target_load(target).num_used_kv_blocks == 0)
    draft_baseline = draft_load(draft).num_used_kv_blocks
    r = httpx.post(stack.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                   json={"model": "smollm2-135m-instruct", "max_tokens": 400, "temperature": 0, "mode": "sd",
                         "timeout": 1.5, "messages": [{"role": "user", "content": "Tell a very long story."}]})
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout_error"
    assert wait_for(lambda: target_load(target).num_used_kv_blocks == 0 and target_load(target).num_running == 0)
    assert wait_for(lambda: (lambda load: load.num_sequences == 0 and load.num_used_kv_blocks == draft_baseline)(
        draft_load(draft)))


def test_the_draft_drops_a_sequence_past_its_deadline_without_a_release(stack):
    draft = stack.draft_address
    assert wait_for(lambda: draft_load(draft).num_sequences == 0)
    baseline = draft_load(draft).num_used_kv_blocks
    go_on: queue.Queue = queue.Queue()

    def requests():  # noqa: ANN202
        yield draft_pb2.SessionRequest(round_id=1, hello=draft_pb2.Hello(target_id="deadline", vocab_size=49152))
        yield draft_pb2.SessionRequest(round_id=2, round=draft_pb2.Round(num_speculative_tokens=3, prefills=[
            draft_pb2.Prefill(seq_id=1, token_ids=[1, 2, 3, 4, 5, 6], time_left_ms=1500)]))
        go_on.get(timeout=60)  # no Release: the stream stays open while the deadline passes
        yield draft_pb2.SessionRequest(round_id=3, round=draft_pb2.Round(num_speculative_tokens=3, outcomes=[
            draft_pb2.Outcome(seq_id=1, num_committed_before=6, new_token_ids=[7], num_accepted=-1)]))

    with grpc.insecure_channel(draft) as ch:
        replies = draft_pb2_grpc.SpeculatorStub(ch).Session(requests(), timeout=60)
        assert next(replies).WhichOneof("kind") == "ready"
        first = next(replies).speculations
        assert [i.seq_id for i in first.items] == [1] and not first.errors
        held = draft_load(draft)
        freed = wait_for(lambda: (lambda load: load.num_sequences == 0 and load.num_used_kv_blocks == baseline)(
            draft_load(draft)), timeout_s=10)
        go_on.put(None)
        later = next(replies).speculations
    assert held.num_sequences == 1 and held.num_used_kv_blocks > baseline  # the round allocated its draft KV
    assert freed  # dropped by the draft itself, the session still open
    assert [(e.seq_id, e.code) for e in later.errors] == [(1, "DEADLINE_EXCEEDED")] and not later.items
