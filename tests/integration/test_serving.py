"""The happy path through real processes: OpenAI streaming and gRPC text equal the offline engine's greedy output."""

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.conftest import API_KEY, MAX_TOKENS, PROMPTS
from tests.integration.helpers import draft_load, openai_client, stream_chat, target_load

pytestmark = pytest.mark.model


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_openai_streaming_chat_equals_offline_greedy(stack, offline_greedy, mode):
    client = openai_client(stack.url, API_KEY)
    for prompt in PROMPTS:
        text, usage = stream_chat(client, prompt, MAX_TOKENS, mode)
        assert text == offline_greedy(prompt)
        assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
        if mode == "sd":
            assert usage["speculation"]["num_drafts"] > 0
        else:
            assert "speculation" not in usage


def test_auto_mode_equals_offline_greedy_and_reports_its_choices(stack, offline_greedy):
    """mode auto: the target speculates only in batches where it measured speculation faster; a fresh chooser tries
    both, so usage.speculation counts speculated rounds and plain steps, and the text stays the greedy text."""
    client = openai_client(stack.url, API_KEY)
    drafts = plain = 0
    for prompt in PROMPTS:
        text, usage = stream_chat(client, prompt, MAX_TOKENS, "auto")
        assert text == offline_greedy(prompt)
        drafts += usage["speculation"]["num_drafts"]
        plain += usage["speculation"].get("num_plain_steps", 0)
    assert drafts > 0 and plain > 0


def test_openai_non_streaming_and_completions(stack, offline_greedy):
    client = openai_client(stack.url, API_KEY)
    prompt = PROMPTS[0]
    reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=MAX_TOKENS,
                                           messages=[{"role": "user", "content": prompt}])
    assert reply.choices[0].message.content == offline_greedy(prompt)
    assert reply.choices[0].finish_reason in ("stop", "length")
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m-instruct"]
    comp = client.completions.create(model="smollm2-135m-instruct", prompt="The capital of France is",
                                     max_tokens=5, temperature=0, stop=["."])
    assert comp.choices[0].text and "." not in comp.choices[0].text


def test_grpc_generate_stream_equals_offline_greedy(stack, offline_greedy):
    prompt = PROMPTS[1]
    with grpc.insecure_channel(stack.grpc_address) as ch:
        stub = gateway_pb2_grpc.GenerationStub(ch)
        req = gateway_pb2.GenerateRequest(
            chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content=prompt)]),
            max_tokens=MAX_TOKENS, mode=common_pb2.SPECULATION_MODE_SD)
        md = (("authorization", f"Bearer {API_KEY}"),)
        parts = list(stub.GenerateStream(req, metadata=md, timeout=120))
        assert "".join(p.text for p in parts) == offline_greedy(prompt)
        assert parts[-1].finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
        assert parts[-1].usage.completion_tokens == sum(len(p.token_ids) for p in parts)
        whole = stub.Generate(req, metadata=md, timeout=120)
        assert whole.text == offline_greedy(prompt)


def test_health_serving_and_reflection(stack):
    for child in stack.children:
        with grpc.insecure_channel(child.address) as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING, child.name
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            reply = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                   timeout=5))
            names = {s.name for s in reply.list_services_response.service}
            assert "grpc.health.v1.Health" in names
            assert names & {"ssd.v1.Generation", "ssd.v1.Verifier", "ssd.v1.Speculator"}, names
    assert httpx.get(stack.url + "/health").status_code == 200


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def test_metrics_move(stack):
    """The request-level series are the gateway's, the engine-side ones the target's (vLLM's names)."""
    target_url = stack.child("target-0").metrics_url
    before, target_before = httpx.get(stack.url + "/metrics").text, httpx.get(target_url).text
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert name in before, name
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"):
        assert name in target_before, name
    stream_chat(openai_client(stack.url, API_KEY), "Say hello.", 8, "sd")
    after, target_after = httpx.get(stack.url + "/metrics").text, httpx.get(target_url).text
    for name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:e2e_request_latency_seconds_count"):
        assert _metric(after, name) > _metric(before, name), name
    name = "vllm:spec_decode_num_draft_tokens_total"
    assert _metric(target_after, name) > _metric(target_before, name), name
    assert target_load(stack.target_addresses[0]).num_draft_tokens > 0
    assert draft_load(stack.draft_address).num_draft_tokens > 0


def test_sampled_sd_carries_q_over_the_session(stack):
    """At temperature > 0 the draft model's q rows travel as an inline Tensor; a seed fixes the output."""
    client = openai_client(stack.url, API_KEY)

    def run() -> tuple[str, dict]:
        reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0.8, seed=7, max_tokens=12,
                                               messages=[{"role": "user", "content": "Name a bird."}],
                                               extra_body={"mode": "sd"})
        return reply.choices[0].message.content, reply.usage.model_dump()

    (text1, usage1), (text2, _) = run(), run()
    assert text1 == text2 and usage1["speculation"]["num_draft_tokens"] > 0


def test_tokenize_counts_what_the_chat_prompt_costs_and_detokenize_reverses_it(stack):
    messages = [{"role": "user", "content": PROMPTS[0]}]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    counted = httpx.post(stack.url + "/tokenize", json={"messages": messages}, headers=headers, timeout=30).json()
    reply = openai_client(stack.url, API_KEY).chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, max_tokens=1, temperature=0)
    assert counted["count"] == len(counted["tokens"]) == reply.usage.prompt_tokens and counted["max_model_len"] > 0
    text = httpx.post(stack.url + "/detokenize", json={"tokens": counted["tokens"]}, headers=headers, timeout=30)
    assert PROMPTS[0] in text.json()["prompt"]


def test_continue_final_message_answers_from_inside_the_assistants_text(stack):
    """vLLM's assistant prefill: the answer continues the last message; the same token-id prompt through
    /v1/completions gives the same greedy text."""
    messages = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "My favourite fruit is"}]
    options = {"add_generation_prompt": False, "continue_final_message": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tokens = httpx.post(stack.url + "/tokenize", json={"messages": messages, **options}, headers=headers,
                        timeout=30).json()["tokens"]
    prompt = httpx.post(stack.url + "/detokenize", json={"tokens": tokens}, headers=headers, timeout=30).json()
    assert prompt["prompt"].endswith("My favourite fruit is")
    client = openai_client(stack.url, API_KEY)
    chat = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=8,
                                          temperature=0, extra_body=options)
    plain = client.completions.create(model="smollm2-135m-instruct", prompt=tokens, max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text and plain.choices[0].text


def test_stop_strings_can_stay_in_the_text_and_prompts_can_be_truncated(stack):
    client = openai_client(stack.url, API_KEY)
    ask = {"model": "smollm2-135m-instruct", "prompt": "The sky is blue because", "max_tokens": 40, "temperature": 0,
           "stop": ["."]}
    cut = client.completions.create(**ask).choices[0]
    kept = client.completions.create(**ask, extra_body={"include_stop_str_in_output": True}).choices[0]
    assert cut.finish_reason == kept.finish_reason == "stop" and kept.text == cut.text + "."
    reply = client.completions.create(model="smollm2-135m-instruct", prompt="one two three four five six seven",
                                      max_tokens=2, extra_body={"truncate_prompt_tokens": 3})
    assert reply.usage.prompt_tokens == 3
