"""Mode "ssd" through the gateway (the main stack: the default model, a tiny random draft model over its
vocabulary): OpenAI and gRPC text equal the offline greedy output, with cache hits / misses in the usage,
the response stats and the gateway's metrics."""

import grpc
import httpx
import pytest

from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.conftest import API_KEY, MAX_TOKENS, PROMPTS
from tests.integration.helpers import openai_client, stream_chat, target_load, wait_for

pytestmark = pytest.mark.model


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + " ", name + "{")))


def test_openai_ssd_chat_equals_offline_greedy(stack, offline_greedy):
    assert wait_for(lambda: target_load(stack.target_addresses[0]).is_draft_connected, timeout_s=60)
    client = openai_client(stack.url, API_KEY)
    prompt = PROMPTS[0]
    text, usage = stream_chat(client, prompt, MAX_TOKENS, "ssd")
    assert text == offline_greedy(prompt)
    spec = usage["speculation"]
    assert spec["num_drafts"] > 0 and spec["num_cache_misses"] >= 1  # the first round has no cache yet
    assert spec["num_cache_hits"] + spec["num_cache_misses"] == spec["num_drafts"]
    metrics = httpx.get(stack.child("target-0").metrics_url).text  # the speculation counters are the target's
    assert _metric(metrics, "ssd:spec_decode_cache_misses_total") >= spec["num_cache_misses"]
    assert "ssd:spec_decode_cache_hits_total" in metrics


def test_grpc_generate_in_ssd_mode_carries_cache_stats(stack, offline_greedy):
    prompt = PROMPTS[1]
    with grpc.insecure_channel(stack.grpc_address) as ch:
        req = gateway_pb2.GenerateRequest(
            chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content=prompt)]),
            max_tokens=MAX_TOKENS, mode=common_pb2.SPECULATION_MODE_SSD)
        reply = gateway_pb2_grpc.GenerationStub(ch).Generate(
            req, metadata=(("authorization", f"Bearer {API_KEY}"),), timeout=120)
    assert reply.text == offline_greedy(prompt)
    assert reply.spec.num_cache_hits + reply.spec.num_cache_misses == reply.spec.num_drafts > 0


def test_unknown_mode_names_the_modes(stack):
    reply = httpx.post(stack.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "mode": "fast"},
                       timeout=30)
    assert reply.status_code == 400 and "ssd" in reply.text
