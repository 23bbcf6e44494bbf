"""Structured output through the real services: the `openai` client's response_format (json_schema and
json_object) and the vLLM-style guided_regex / guided_grammar / guided_choice give valid answers equal to the
offline engine's, in every mode (the draft service compiles the grammar too and drafts under it; the target's
masks keep the answer exact), over the public gRPC API too; a bad schema is a 400 that leaves the service
serving."""

import json

import grpc
import httpx
import openai
import pytest

from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France? Answer in JSON."
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "country", "is_capital"],
          "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24},
                         "is_capital": {"type": "boolean"}}}


def _offline(offline_greedy, kind: str, source: str, max_tokens: int = 48) -> str:
    from ssd.sampling.grammar import Grammar
    from ssd.sampling.params import SamplingParams

    llm = offline_greedy.llm
    prompt = llm.chat_prompt([{"role": "user", "content": QUESTION}])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, grammar=Grammar(kind, source))
    out = llm.generate(prompt, params)[0]
    assert out.finish_reason == "stop"
    return out.text


@pytest.mark.parametrize("mode", ["ar", "sd", "ssd"])
def test_json_schema_answers_are_valid_and_equal_the_offline_engine(stack, offline_greedy, mode):
    expected = _offline(offline_greedy, "json_schema", json.dumps(SCHEMA))
    answer = json.loads(expected)
    assert set(answer) == {"city", "country", "is_capital"} and isinstance(answer["is_capital"], bool)
    client = openai_client(stack.url, API_KEY)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "strict": True, "schema": SCHEMA}},
        extra_body={"mode": mode})
    assert reply.choices[0].message.content == expected
    assert reply.choices[0].finish_reason == "stop"
    if mode != "ar":  # the draft service compiled the grammar to draft under it
        assert "drafting structured output under its grammar" in (stack.config.log_dir / "draft.log").read_text()


def test_json_object_and_guided_regex(stack, offline_greedy):
    client = openai_client(stack.url, API_KEY)
    messages = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, temperature=0,
                                           response_format={"type": "json_object"})
    content = reply.choices[0].message.content
    assert content == _offline(offline_greedy, "json_schema", '{"type": "object"}')
    assert isinstance(json.loads(content), dict)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, extra_body={"guided_regex": "(Paris|Lyon|Nice)"})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == _offline(offline_greedy, "regex", "(Paris|Lyon|Nice)") and text in ("Paris", "Lyon", "Nice")
    lark = 'start: city ", " country\ncity: "Paris" | "Lyon"\ncountry: /[A-Z][a-z]{2,12}/'
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                           extra_body={"guided_grammar": lark, "mode": "sd"})
    content = reply.choices[0].message.content
    assert content == _offline(offline_greedy, "lark", lark) and content.split(", ")[0] in ("Paris", "Lyon")
    choices = ["Paris (France)", "Lyon", "Nice?"]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                           extra_body={"guided_choice": choices})
    assert reply.choices[0].message.content in choices


def test_grpc_generate_takes_a_grammar(stack, offline_greedy):
    with grpc.insecure_channel(stack.grpc_address) as ch:
        req = gateway_pb2.GenerateRequest(
            chat=gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="user", content=QUESTION)]),
            max_tokens=48, mode=common_pb2.SPECULATION_MODE_SD,
            grammar=common_pb2.Grammar(json_schema=json.dumps(SCHEMA)))
        reply = gateway_pb2_grpc.GenerationStub(ch).Generate(req, metadata=[("authorization", f"Bearer {API_KEY}")],
                                                             timeout=120)
    assert reply.text == _offline(offline_greedy, "json_schema", json.dumps(SCHEMA))


def test_a_bad_schema_is_a_400_and_the_service_keeps_serving(stack):
    client = openai_client(stack.url, API_KEY)
    messages = [{"role": "user", "content": QUESTION}]
    with pytest.raises(openai.BadRequestError, match="objectx"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}})
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                       response_format={"type": "json_object"}, extra_body={"ignore_eos": True})
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_grammar_requests_are_counted_by_kind(stack):
    client = openai_client(stack.url, API_KEY)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=4,
                                   extra_body={"guided_regex": "(yes|no)"})
    metrics = httpx.get(stack.url + "/metrics").text
    assert 'ssd_structured_output_requests_total{grammar="regex"}' in metrics
