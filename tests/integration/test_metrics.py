"""Every service's /metrics through real processes (the main stack): each page parses with prometheus_client's
parser, carries vLLM's names and types, and the vLLM-named series move under a few requests; the prefix cache's
hits reach the client as usage.prompt_tokens_details.cached_tokens."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client, scrape, stream_chat, target_load, wait_for

pytestmark = pytest.mark.model

GATEWAY = {"vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
           "vllm:e2e_request_latency_seconds": "histogram", "vllm:prompt_tokens": "counter",
           "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
           "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
           "vllm:request_params_max_tokens": "histogram"}
TARGET = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
          "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_queries": "counter",
          "vllm:prefix_cache_hits": "counter", "vllm:spec_decode_num_drafts": "counter",
          "vllm:spec_decode_num_draft_tokens": "counter", "vllm:spec_decode_num_accepted_tokens": "counter",
          "vllm:spec_decode_num_accepted_tokens_per_pos": "counter", "ssd:spec_decode_cache_hits": "counter",
          "ssd:spec_decode_cache_misses": "counter", "ssd:spec_decode_verify_seconds": "counter"}
DRAFT = {"vllm:num_requests_running": "gauge", "vllm:kv_cache_usage_perc": "gauge",
         "vllm:generation_tokens": "counter", "ssd:speculation_cache_hits": "counter",
         "ssd:speculation_cache_misses": "counter", "ssd:speculation_cache_build_seconds": "counter"}
# a long prompt, asked twice: its leading blocks come from the prefix cache the second time
PROMPT = ("Here are some facts about the metrics test: " + " ".join(f"fact {i} is {i * 7}." for i in range(40))
          + " Which fact comes first?")


def _types(url: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(httpx.get(url, timeout=10).text)}


def _urls(stack) -> dict[str, str]:  # noqa: ANN001
    return {"gateway": stack.child("gateway").metrics_url, "target": stack.child("target-0").metrics_url,
            "draft": stack.child("draft").metrics_url}


def test_every_page_parses_with_vllms_names_and_types(stack) -> None:  # noqa: ANN001
    urls = _urls(stack)
    for service, expected in (("gateway", GATEWAY), ("target", TARGET), ("draft", DRAFT)):
        found = _types(urls[service])
        assert {name: found.get(name) for name in expected} == expected, service
    model = 'model_name="smollm2-135m-instruct"'
    assert model in httpx.get(urls["target"], timeout=10).text
    assert model in httpx.get(urls["gateway"], timeout=10).text


def test_the_vllm_series_move_under_load(stack) -> None:  # noqa: ANN001
    assert wait_for(lambda: target_load(stack.target_addresses[0]).is_draft_connected, timeout_s=60)
    urls = _urls(stack)
    before = {service: scrape(url) for service, url in urls.items()}
    client = openai_client(stack.url, API_KEY)
    usages = []
    for _ in range(2):
        reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=8,
                                               messages=[{"role": "user", "content": PROMPT}],
                                               extra_body={"mode": "sd"})
        usages.append(reply.usage)
    _, ssd_usage = stream_chat(client, "Count to five.", 8, "ssd")
    after = {service: scrape(url) for service, url in urls.items()}

    def grew(service: str, name: str) -> float:
        return after[service].get(name, 0.0) - before[service].get(name, 0.0)

    assert grew("gateway", "vllm:time_to_first_token_seconds_count") == 3
    assert grew("gateway", "vllm:e2e_request_latency_seconds_count") == 3
    assert grew("gateway", "vllm:inter_token_latency_seconds_count") > 0
    assert grew("gateway", "vllm:request_success_total") == 3
    assert grew("gateway", "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages) + ssd_usage[
        "prompt_tokens"]
    assert grew("gateway", "vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages) + ssd_usage[
        "completion_tokens"]

    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert cached[1] > 0 and cached[1] >= cached[0]  # the second ask reuses the first one's prefix
    ssd_cached = ssd_usage["prompt_tokens_details"]["cached_tokens"]
    assert grew("target", "vllm:prefix_cache_hits_total") == sum(cached) + ssd_cached
    assert grew("target", "vllm:prefix_cache_queries_total") == grew("gateway", "vllm:prompt_tokens_total")
    assert grew("target", "vllm:spec_decode_num_drafts_total") > 0
    assert grew("target", "vllm:spec_decode_num_draft_tokens_total") > 0
    spec = ssd_usage["speculation"]
    assert grew("target", "ssd:spec_decode_cache_hits_total") == spec["num_cache_hits"]
    assert grew("target", "ssd:spec_decode_cache_misses_total") == spec["num_cache_misses"] >= 1

    assert grew("draft", "vllm:generation_tokens_total") >= grew("target", "vllm:spec_decode_num_draft_tokens_total")
    assert grew("draft", "ssd:speculation_cache_misses_total") >= spec["num_cache_misses"]


def test_grpc_usage_carries_the_cached_prompt_tokens(stack) -> None:  # noqa: ANN001
    import grpc

    from protos.ssd.v1 import gateway_pb2, gateway_pb2_grpc

    req = gateway_pb2.GenerateRequest(
        chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content=PROMPT + " Again.")]),
        max_tokens=4)
    md = (("authorization", f"Bearer {API_KEY}"),)
    with grpc.insecure_channel(stack.grpc_address) as ch:
        stub = gateway_pb2_grpc.GenerationStub(ch)
        first = stub.Generate(req, metadata=md, timeout=120).usage
        second = stub.Generate(req, metadata=md, timeout=120).usage
        streamed = list(stub.GenerateStream(req, metadata=md, timeout=120))[-1].usage
    assert second.cached_prompt_tokens > 0 and second.cached_prompt_tokens >= first.cached_prompt_tokens
    assert second.cached_prompt_tokens < second.prompt_tokens  # the last prompt token is always computed
    assert streamed.cached_prompt_tokens == second.cached_prompt_tokens
