"""Function calling on the HTTP bridge, with a stub generator (no model): tools and tool_choice become the request's
grammar (or, for "auto", tagged calls parsed out of free text), answers come back as OpenAI `tool_calls` (whole and
streamed), refused forms are 400s naming the field, and the chat template gets the tools (or a system message
describing them) and past calls."""

import asyncio
import json

import pytest

from gateway.generation import TextDelta, TextRequest
from gateway.tokenizer import ChatRender, TextTokenizer
from protos.ssd.v1 import target_pb2
from tests.gateway.test_http_asgi import StubGenerator, _post, assert_openai_error, make_app

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class AnsweringGenerator(StubGenerator):
    """Answers with fixed text pieces (the model's tool-call JSON), whole or streamed."""

    def __init__(self, pieces: list[str], finish_reason: str = "stop") -> None:
        super().__init__()
        self.pieces, self.finish_reason = pieces, finish_reason

    async def complete(self, req: TextRequest) -> TextDelta:
        self.requests.append(req)
        return TextDelta("".join(self.pieces), [1], self.finish_reason, prompt_tokens=3, completion_tokens=1)

    async def stream(self, req: TextRequest):  # noqa: ANN201
        self.requests.append(req)
        for i, piece in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            yield TextDelta(piece, [i], self.finish_reason if last else None, prompt_tokens=3, completion_tokens=i + 1)


def _chat(gen: StubGenerator, **extra) -> object:  # noqa: ANN003
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 32, **extra}
    return asyncio.run(_post(make_app(gen), json.dumps(body).encode(), "/v1/chat/completions"))


def _grammar(gen: StubGenerator) -> dict:
    return json.loads(gen.requests[0].params.grammar.json_schema)


def test_a_named_tool_choice_answers_with_that_functions_arguments():
    gen = AnsweringGenerator(['{"city": ', '"Paris"}'])
    r = _chat(gen, tools=TOOLS, tool_choice=NAMED)
    assert r.status_code == 200, r.text
    assert _grammar(gen) == WEATHER
    assert [t["function"]["name"] for t in gen.requests[0].render.tools] == ["get_weather", "get_time"]
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_required_answers_with_one_or_more_calls_each_following_its_tool():
    gen = AnsweringGenerator(['[{"name": "get_weather", "arguments": {"city": "Paris"}}, ',
                              '{"name": "get_time", "arguments": {}}]'])
    r = _chat(gen, tools=TOOLS, tool_choice="required")
    assert r.status_code == 200, r.text
    grammar = _grammar(gen)
    assert grammar["type"] == "array" and grammar["minItems"] == 1 and "maxItems" not in grammar
    weather, time = grammar["items"]["anyOf"]
    assert weather["properties"] == {"name": {"const": "get_weather"}, "arguments": WEATHER}
    assert time["properties"]["arguments"] == {"type": "object", "properties": {}, "additionalProperties": False}
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c["id"] for c in choice["message"]["tool_calls"]}) == 2
    gen = AnsweringGenerator(['[{"name": "get_time", "arguments": {}}]'])
    _chat(gen, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert _grammar(gen)["maxItems"] == 1


def test_a_cut_off_required_answer_is_returned_as_text():
    gen = AnsweringGenerator(['[{"name": "get_weather", "argu'], finish_reason="length")
    choice = _chat(gen, tools=TOOLS, tool_choice="required").json()["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == '[{"name": "get_weather", "argu'


def _events(r) -> list[dict]:  # noqa: ANN001
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_a_streamed_named_call_opens_with_its_name_then_streams_the_arguments():
    gen = AnsweringGenerator(['{"city": ', '"Pa', 'ris"}'])
    r = _chat(gen, tools=TOOLS, tool_choice=NAMED, stream=True)
    deltas = [e["choices"][0]["delta"] for e in _events(r)][1:]  # after the role chunk
    first = deltas[0]["tool_calls"][0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["function"]["name"] == "get_weather"
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if d)
    assert arguments == '{"city": "Paris"}'
    assert _events(r)[-1]["choices"][0]["finish_reason"] == "stop"


def test_streamed_required_calls_come_whole_with_the_last_chunk():
    gen = AnsweringGenerator(['[{"name": "get_time", ', '"arguments": {}}]'])
    events = _events(_chat(gen, tools=TOOLS, tool_choice="required", stream=True))
    assert [e["choices"][0]["delta"] for e in events[1:-1]] == [{}]
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    assert last["delta"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}


CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.mark.parametrize(("answer", "content", "calls"), [
    (CALL_TEXT, None, [("get_weather", {"city": "Paris"})]),
    ("Let me look.\n" + CALL_TEXT + '\n<tool_call>{"name": "get_time", "arguments": {}}',  # the last tag unclosed
     "Let me look.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ("It is sunny in Paris.", "It is sunny in Paris.", None),
    ('<tool_call>{"name": "get_news", "arguments": {}}</tool_call>', '<tool_call>{"name": "get_news", '
     '"arguments": {}}</tool_call>', None),  # not a tool: text
    ("<tool_call>{not json</tool_call>", "<tool_call>{not json</tool_call>", None),
    ('<tool_call>{"name": ["get_time"]}</tool_call>', '<tool_call>{"name": ["get_time"]}</tool_call>', None),
    ('<tool_call>{"name": "get_time", "arguments": 5}</tool_call>',
     '<tool_call>{"name": "get_time", "arguments": 5}</tool_call>', None),
    ('<tool_call>["get_time"]</tool_call>', '<tool_call>["get_time"]</tool_call>', None),
    ('<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call> Done.', "Done.", [("get_time", {})]),
])
def test_auto_parses_tagged_calls_out_of_free_text(answer, content, calls):
    gen = AnsweringGenerator([answer])
    r = _chat(gen, tools=TOOLS)  # tool_choice "auto": the default with tools
    assert r.status_code == 200, r.text
    assert not gen.requests[0].params.HasField("grammar") and gen.requests[0].render.tool_tags
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == content
    if calls is None:
        assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
        return
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == calls


def test_streamed_auto_sends_text_up_to_the_tag_and_the_calls_at_the_end():
    pieces = ["Let me look. <tool", "_call>", '{"name": "get_time", ', '"arguments": {}}</tool_call>']
    events = _events(_chat(AnsweringGenerator(pieces), tools=TOOLS, tool_choice="auto", stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert "".join(d.get("content", "") for d in deltas) == "Let me look. "  # never a piece of the tag
    assert deltas[-1]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    plain = _events(_chat(AnsweringGenerator(["Sunny ", "<b>today</b>"]), tools=TOOLS, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in plain[1:]) == "Sunny <b>today</b>"
    assert plain[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_answers_in_text_without_the_tools():
    gen = AnsweringGenerator(["It is sunny."])
    r = _chat(gen, tools=TOOLS, tool_choice="none")
    assert r.json()["choices"][0]["message"]["content"] == "It is sunny."
    assert not gen.requests[0].params.HasField("grammar") and gen.requests[0].render.tools is None


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}], "tool_choice": "required"},
     "tools.0.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
])
def test_tool_requests_that_cannot_be_served_are_400s_naming_the_field(extra, param):
    gen = AnsweringGenerator(["{}"])
    r = _chat(gen, **extra)
    assert_openai_error(r, 400)
    assert r.json()["error"]["param"].startswith(param), r.json()
    assert gen.requests == []


@pytest.mark.parametrize("message", [
    {"role": "tool", "content": "18 C"},  # no tool_call_id
    {"role": "assistant", "content": None},  # no content and no calls
])
def test_malformed_tool_messages_are_400s(message):
    gen = AnsweringGenerator(["{}"])
    body = {"messages": [{"role": "user", "content": "hi"}, message], "max_tokens": 4}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), "/v1/chat/completions"))
    assert_openai_error(r, 400)


def test_a_conversation_with_calls_and_results_reaches_the_template():
    gen = AnsweringGenerator(["It is 18 C in Paris."])
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    body = {"messages": messages, "max_tokens": 16, "tools": TOOLS, "tool_choice": "none"}
    r = asyncio.run(_post(make_app(gen), json.dumps(body).encode(), "/v1/chat/completions"))
    assert r.status_code == 200, r.text
    sent = gen.requests[0].messages
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert sent[2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}


def _tokenizer(template: str) -> TextTokenizer:
    from tokenizers import Tokenizer, models

    files = target_pb2.TokenizerFiles(tokenizer_json=Tokenizer(models.BPE()).to_str().encode(),
                                      chat_template=template)
    return TextTokenizer(files)


PLAIN = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
TOOLED = "{% if tools %}TOOLS={{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}" + PLAIN
CALL = {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}


def test_a_template_without_tools_gets_them_in_a_system_message_and_calls_as_text():
    tok = _tokenizer(PLAIN)
    text = tok.chat_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time?"},
                            {"role": "assistant", "content": "", "tool_calls": [CALL]}], ChatRender(TOOLS))
    system, user, assistant = text.splitlines()[0], text.splitlines()[-2], text.splitlines()[-1]
    assert system.startswith("<system>Be brief.") and '"name": "get_weather"' in text and "Weather now" in text
    assert user == "<user>Time?" and assistant == '<assistant>[{"name": "get_time", "arguments": "{}"}]'
    assert tok.chat_prompt([{"role": "user", "content": "Hi"}], ChatRender(TOOLS)).startswith("<system>You can call")
    assert "<tool_call>" not in text and "<tool_call>" in tok.chat_prompt([{"role": "user", "content": "Hi"}],
                                                                         ChatRender(TOOLS, tool_tags=True))


def test_a_template_that_knows_tools_renders_them_itself():
    text = _tokenizer(TOOLED).chat_prompt([{"role": "user", "content": "Time?"}], ChatRender(TOOLS))
    assert text == "TOOLS=get_weather,get_time\n<user>Time?\n"
