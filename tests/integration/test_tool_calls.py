"""Function calling through the real services with the `openai` client: a named tool choice and "required" answer
with calls whose arguments parse and follow the tool's schema, the same in ar, sd and ssd (greedy, float32),
streamed as the client assembles them; a tool's result goes back into the conversation; "auto" lets the model
choose, whole and streamed alike."""

import json

import pytest

from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a city now",
                                           "parameters": {"type": "object", "additionalProperties": False,
                                                          "required": ["city"],
                                                          "properties": {"city": {"type": "string",
                                                                                  "maxLength": 20}}}}}]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _named_call(client, mode: str):  # noqa: ANN001, ANN202
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=NAMED,
                                           max_tokens=40, temperature=0, extra_body={"mode": mode})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    return call.function.arguments


def test_a_named_tool_call_follows_the_schema_in_every_mode(stack):
    client = openai_client(stack.url, API_KEY)
    arguments = {mode: _named_call(client, mode) for mode in ("ar", "sd", "ssd")}
    assert arguments["sd"] == arguments["ar"] and arguments["ssd"] == arguments["ar"]
    parsed = json.loads(arguments["ar"])
    assert set(parsed) == {"city", "unit"} and parsed["unit"] in ("celsius", "fahrenheit")
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=NAMED,
                                            max_tokens=40, temperature=0, stream=True, extra_body={"mode": "ssd"})
    chunks = [c for c in stream if c.choices]
    streamed = "".join(d.function.arguments or "" for c in chunks for d in c.choices[0].delta.tool_calls or [])
    assert streamed == arguments["ar"] and chunks[-1].choices[0].finish_reason == "stop"


def test_required_calls_name_the_tools_and_the_result_goes_back_into_the_conversation(stack):
    client = openai_client(stack.url, API_KEY)
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    assert "city" in json.loads(call.function.arguments)
    follow_up = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius, sunny"}]
    answer = client.chat.completions.create(model=MODEL, messages=follow_up, tools=TOOLS, tool_choice="none",
                                            max_tokens=24, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_auto_lets_the_model_choose_and_streams_the_same_answer(stack):
    """The default model was not trained to call tools: under "auto" it may answer in text (it does, greedy, for
    this question); either way the answer is well formed, and the stream carries the same."""
    client = openai_client(stack.url, API_KEY)
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, max_tokens=24, temperature=0)
    message = reply.choices[0].message
    if message.tool_calls:
        assert reply.choices[0].finish_reason == "tool_calls"
        assert all(c.function.name in ("get_weather", "get_time") and json.loads(c.function.arguments)
                   for c in message.tool_calls)
    else:
        assert message.content and "<tool_call>" not in message.content
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, max_tokens=24,
                                            temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (message.content or "")
    assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason
