"""OpenAI request bodies: the fields we honour, and the OpenAI options we do not implement.

Those options are accepted at their neutral value and refused otherwise (a 400 naming the field), so no request
silently gets something other than what it asked for. Other unknown fields (`user`, `store`, `metadata`, ...)
are ignored, as OpenAI clients send many.
"""

import json
from collections.abc import Iterable
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.errors import InvalidRequest
from gateway.request_checks import MAX_TOP_LOGPROBS
from gateway.tokenizer import ChatRender
from gateway.tool_calls import Tool, ToolCall, ToolChoice, ToolPlan, plan_tools
from protos.ssd.v1 import common_pb2

MAX_CHOICES = 16  # OpenAI `n` at most (each choice is a full request)
MAX_TARGET_REQUESTS = 256  # prompts x choices (or best_of) of one completions request
INT32_END = 2**31  # the wire's int32 fields hold less than this
TokenId = Annotated[StrictInt, Field(ge=0, lt=INT32_END)]  # fits the wire's int32; checked against the vocabulary
Count = Annotated[int, Field(ge=0, lt=INT32_END)]  # a count on the wire (int32)
MAX_JSON_DEPTH = 64  # nesting of a request body (JSON schemas included); deeper bodies are refused

# OpenAI option -> the values that ask for nothing (compared as JSON compares them: 0 == 0.0, but 0 != false).
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
    "functions": (None, []),  # the deprecated forms of tools / tool_choice
    "function_call": (None, "none", "auto"),
}


def is_neutral(value: Any, neutrals: Iterable[Any]) -> bool:  # noqa: ANN401
    """`value` is one of `neutrals` as JSON values (a boolean equals only a boolean)."""
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutrals)


_REGEX_META = frozenset("\\.+*?()|[]{}^$")


def choice_regex(choices: list[str]) -> str:
    """A regular expression whose whole matches are exactly the given strings (vLLM's guided_choice)."""
    return "(" + "|".join("".join("\\" + c if c in _REGEX_META else c for c in s) for s in choices) + ")"


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")  # None: any JSON value
    strict: StrictBool | None = None  # the schema is always enforced


class ResponseFormat(BaseModel):
    """OpenAI's response_format: free text, any JSON object, or JSON that follows a schema."""

    model_config = ConfigDict(strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format of type "json_schema" needs a "json_schema" field')
        return self

    def schema_text(self) -> str | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return '{"type": "object"}'
        schema = self.json_schema.json_schema  # set: checked by _schema_given
        return json.dumps({} if schema is None else schema)


def ill_formed(value: Any) -> str | None:  # noqa: ANN401
    """Why a parsed JSON body cannot be served (a string that is not valid UTF-8, i.e. a lone surrogate
    escape such as "\\ud800"; nesting deeper than MAX_JSON_DEPTH), with where; None when it is fine.
    Iterative, so a deep body cannot exhaust the stack."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"the request body nests deeper than {MAX_JSON_DEPTH} levels (at {where or 'the top'})"
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return f"{where or 'the body'} is not valid UTF-8 text (a lone surrogate)"
        elif isinstance(item, dict):
            for k, v in item.items():
                stack.append((k, where, depth + 1))
                stack.append((v, f"{where}.{k}" if where else str(k), depth + 1))
        elif isinstance(item, list):
            stack.extend((v, f"{where}.{i}" if where else str(i), depth + 1) for i, v in enumerate(item))
    return None


class _Body(BaseModel):
    """A request body: refused when ill_formed, before any field is read. Strict: a JSON value has the type its
    field documents (no "5" for 5, no false for 0), as the OpenAPI document says."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _well_formed(cls, data: Any) -> Any:  # noqa: ANN401
        problem = ill_formed(data)
        if problem is not None:
            raise ValueError(problem)
        return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: StrictBool = False  # a last chunk with the usage of every choice
    continuous_usage_stats: StrictBool = False  # extension (vLLM): each chunk carries its choice's usage so far


class _Sampling(_Body):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: Count | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Count = 0  # extension (vLLM-style)
    ignore_eos: StrictBool = False  # extension (vLLM-style): EOS does not end the answer
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)  # extension (vLLM / HF): prompt and answer tokens
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # extension (vLLM): relative probability floor
    min_tokens: Count = 0  # extension (vLLM): EOS / stop token ids barred before this many
    stop_token_ids: list[TokenId] | None = None  # extension (vLLM): token ids that end the answer
    include_stop_str_in_output: StrictBool = False  # extension (vLLM): the stop string that ended the text stays
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, lt=INT32_END)  # extension (vLLM): last N tokens
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)  # the wire's int64
    timeout: float | None = Field(default=None, gt=0.0, le=86400.0)  # extension: seconds; past it 504
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # extension: decoding mode; auto = speculate only where the target measured it faster; None = the server default
    mode: Literal["ar", "sd", "ssd", "auto"] | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)  # independent choices, generated concurrently
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI sends it) -> bias
    suffix: Any = Field(default=None, json_schema_extra={"enum": list(NEUTRAL_VALUES["suffix"])})
    functions: Any = Field(default=None, json_schema_extra={"enum": list(NEUTRAL_VALUES["functions"])})
    function_call: Any = Field(default=None, json_schema_extra={"enum": list(NEUTRAL_VALUES["function_call"])})
    response_format: ResponseFormat | None = None  # structured output (json_object, json_schema)
    guided_json: dict[str, Any] | str | None = None  # extension (vLLM): a JSON schema the answer follows
    guided_regex: str | None = None  # extension (vLLM): a regular expression the whole answer matches
    guided_grammar: str | None = None  # extension (vLLM): a Lark grammar (llguidance's dialect) of the answer
    guided_choice: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)  # (vLLM)

    @field_validator(*NEUTRAL_VALUES)
    @classmethod
    def _neutral_only(cls, value: Any, info: ValidationInfo) -> Any:  # noqa: ANN401
        name = str(info.field_name)
        if not is_neutral(value, NEUTRAL_VALUES[name]):
            accepted = ", ".join(repr(v) for v in NEUTRAL_VALUES[name][1:])
            raise ValueError(f"{name}={value!r} is not supported by this server (accepted: {accepted} or leave it out)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit() and int(key) < 2**31):
                raise ValueError(f"logit_bias keys are token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}")
        return value

    def grammar(self) -> common_pb2.Grammar | None:
        """The structured-output constraint asked for (at most one way), as the wire's Grammar."""
        guided_json = json.dumps(self.guided_json) if isinstance(self.guided_json, dict) else self.guided_json
        asked = {name: (kind, text) for name, kind, text in (  # field -> (Grammar kind, its text)
            ("response_format", "json_schema", self.response_format.schema_text() if self.response_format else None),
            ("guided_json", "json_schema", guided_json),
            ("guided_regex", "regex", self.guided_regex),
            ("guided_choice", "regex", choice_regex(self.guided_choice) if self.guided_choice else None),
            ("guided_grammar", "lark", self.guided_grammar)) if text is not None}
        if len(asked) > 1:
            raise InvalidRequest(f"ask for one structured output at most, got {' and '.join(asked)}",
                                 param=next(iter(asked)))
        return common_pb2.Grammar(**dict(asked.values())) if asked else None

    def token_bias(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    def text_options(self) -> dict[str, Any]:
        """The TextRequest fields these options set."""
        return {"include_stop": self.include_stop_str_in_output, "truncate_prompt_tokens": self.truncate_prompt_tokens}

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


CHAT_ONLY_NEUTRAL: list[Any] = [None, [], "none", "auto"]  # what /v1/completions accepts of tools, tool_choice


class CompletionRequest(_Sampling):
    # for the OpenAPI document: max_tokens 0 only scores the prompt (echo, not streamed)
    model_config = ConfigDict(extra="ignore", json_schema_extra={
        "if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
        "then": {"required": ["echo"], "properties": {"echo": {"const": True}, "stream": {"not": {"const": True}}}}})

    # text, several texts, token ids, or several token-id lists (as OpenAI's completions accept)
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # top alternatives per token
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)  # candidates; the n likeliest are returned
    echo: StrictBool = False  # the prompt leads the text (and, with logprobs, the logprobs: its first token unscored)
    tools: Any = Field(default=None, json_schema_extra={"enum": CHAT_ONLY_NEUTRAL})  # chat options: neutral only
    tool_choice: Any = Field(default=None, json_schema_extra={"enum": CHAT_ONLY_NEUTRAL})

    @field_validator("tools", "tool_choice")
    @classmethod
    def _chat_only(cls, value: Any, info: ValidationInfo) -> Any:  # noqa: ANN401
        if not is_neutral(value, CHAT_ONLY_NEUTRAL):
            raise ValueError(f"{info.field_name} is not supported on /v1/completions: function calling is a "
                             "/v1/chat/completions option")
        return value

    def candidates(self) -> int:
        return self.best_of or self.n or 1

    @model_validator(mode="after")
    def _echo_whole_prompt(self) -> "CompletionRequest":
        if self.echo and self.truncate_prompt_tokens:
            raise ValueError("echo and truncate_prompt_tokens cannot be combined (which prompt would be echoed?)")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request: a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequest("the prompt list is empty", param="prompt")
        return [p] if isinstance(p[0], int) else list(p)

    def wanted_logprobs(self) -> int | None:
        return self.logprobs


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


_MESSAGE_RULES = {"allOf": [  # _complete, for the OpenAPI document
    {"if": {"not": {"required": ["role", "tool_calls"],
                    "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}}}},
     "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}},
    {"if": {"required": ["role"], "properties": {"role": {"const": "tool"}}},
     "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string", "minLength": 1}}}}]}


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", json_schema_extra=_MESSAGE_RULES, strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None  # None only for an assistant message that called tools
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def _complete(self) -> "Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (HF conventions)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class _ChatRendering(_Body):
    """vLLM's chat-template options (chat completions and /tokenize)."""

    add_generation_prompt: StrictBool = True  # open the assistant's turn after the messages
    continue_final_message: StrictBool = False  # the answer continues the last (assistant) message
    chat_template_kwargs: dict[str, Any] | None = None  # more template variables (e.g. Qwen3's enable_thinking)

    @model_validator(mode="after")
    def _consistent(self) -> "_ChatRendering":
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt: false (the answer continues the "
                             "last message instead of opening a new turn)")
        messages = getattr(self, "messages", None)
        if self.continue_final_message and messages and messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(self.chat_template_kwargs or {}))
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)} (the server sets them)")
        return self

    def chat_render(self, tools: list[dict[str, Any]] | None = None, tool_tags: bool = False) -> ChatRender:
        return ChatRender(tools, tool_tags, self.add_generation_prompt, self.continue_final_message,
                          self.chat_template_kwargs)


class ChatCompletionRequest(_ChatRendering, _Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1, lt=INT32_END)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, lt=INT32_END)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Any = Field(default=None, json_schema_extra={"enum": [None, 1]})  # completions options: neutral only
    echo: Any = Field(default=None, json_schema_extra={"enum": [None, False]})
    tools: list[Tool] | None = None  # function calling (gateway/tool_calls.py)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool = True  # "required" may answer with several calls

    @field_validator("best_of", "echo")
    @classmethod
    def _completions_only(cls, value: Any, info: ValidationInfo) -> Any:  # noqa: ANN401
        if not is_neutral(value, (None, 1 if info.field_name == "best_of" else False)):
            raise ValueError(f"{info.field_name}={value!r} is not supported by this server on chat completions "
                             "(a /v1/completions option)")
        return value

    def candidates(self) -> int:
        return self.n or 1

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return value

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @cached_property
    def tool_plan(self) -> ToolPlan | None:
        """How the answer becomes tool calls (None: text); InvalidRequest when the tool choice cannot be served."""
        return plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls)

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template: only when the answer is tool calls."""
        return [t.model_dump(exclude_none=True) for t in self.tools or []] if self.tool_plan else None

    def grammar(self) -> common_pb2.Grammar | None:
        plan, asked = self.tool_plan, super().grammar()
        if plan is None or plan.schema is None:  # "auto" writes free text (its calls in tags)
            return asked
        if asked is not None:
            raise InvalidRequest("a tool choice answers in tool calls; it cannot be combined with response_format "
                                 "or guided_*", param="tool_choice")
        return common_pb2.Grammar(json_schema=json.dumps(plan.schema))


class TokenizeRequest(_ChatRendering):
    """vLLM's /tokenize: a prompt, or chat messages rendered by the chat template (as the target would see them)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"oneOf": [  # exactly one of them (_one_input)
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(_Body):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[TokenId]
