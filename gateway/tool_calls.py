"""Function calling (OpenAI `tools` / `tool_choice` on chat completions), built on structured output.

A named tool choice and "required" are grammars: the answer is the named function's arguments (a JSON object
following its `parameters` schema), or a JSON array of one or more `{"name": ..., "arguments": {...}}` calls,
each naming one of the tools and following that tool's schema. So every call parses and fits its function,
and the response carries it as `tool_calls` instead of text. "auto" (the model decides between text and calls)
needs a parser for the model's own tool-call format, which this server does not have; it is refused with the
way out. "none" answers in text, without the tools in the prompt.

The tools reach the chat template as `tools` (a template that knows them renders them); a template that does
not mention tools gets them in a system message instead, so the model reads their names and descriptions.
"""

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequest

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS_PREAMBLE = ("You can call these functions. Each is given as JSON: its name, what it does and a JSON schema of "
                  "its arguments.")


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments; None = no arguments
    strict: bool | None = None  # the schema is always enforced

    def schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters else NO_ARGUMENTS


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it back


class ToolCall(BaseModel):
    """A call in an assistant message of the conversation so far."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


@dataclass(frozen=True)
class ToolPlan:
    """How a request's answer becomes tool calls: the arguments of `named`, or every call of a JSON array."""

    named: str | None  # the function a named tool choice forces; None = "required" (an array of calls)
    schema: dict[str, Any]  # the answer's JSON schema (the request's grammar)

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The OpenAI `tool_calls` of an answer; None when a "required" answer holds no whole array (cut off by
        max_tokens or a stop string: the grammar makes every finished answer parse)."""
        if self.named is not None:  # cut off or not, the text is the call's arguments (as OpenAI returns them)
            return [tool_call(self.named, text)]
        try:
            calls = json.loads(text)
        except json.JSONDecodeError:
            return None
        return [tool_call(c["name"], json.dumps(c["arguments"])) for c in calls]

    def finish_reason(self, finish_reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" when the model chose to call ("required"), "stop" when the call was forced."""
        return "tool_calls" if finish_reason == "stop" and self.named is None else finish_reason


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def plan_tools(tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool) -> ToolPlan | None:
    """The plan for a request's tools and tool_choice; None = answer in text. InvalidRequest (400) when the
    choice cannot be served."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice names a tool but the request has no tools", param="tool_choice")
        return None
    by_name = {t.function.name: t.function for t in tools}
    if len(by_name) < len(tools):
        raise InvalidRequest("two tools have the same name", param="tools")
    if choice == "none":
        return None
    if choice in (None, "auto"):
        raise InvalidRequest(
            'tool_choice "auto" (the default with tools) is not supported: this server has no parser for the '
            'model\'s own tool-call format. Ask for "required" (one or more calls) or a named function '
            '({"type": "function", "function": {"name": ...}}), or "none"', param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        function = by_name.get(choice.function.name)
        if function is None:
            raise InvalidRequest(f"tool_choice names {choice.function.name!r}, which is not among the tools",
                                 param="tool_choice")
        return ToolPlan(function.name, function.schema())
    call = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
             "properties": {"name": {"const": f.name}, "arguments": f.schema()}} for f in by_name.values()]
    array = {"type": "array", "minItems": 1, "items": call[0] if len(call) == 1 else {"anyOf": call}}
    return ToolPlan(None, array if parallel else array | {"maxItems": 1})


def tools_message(tools: list[dict[str, Any]]) -> dict[str, str]:
    """The tools as a system message, for a chat template that does not render `tools` itself."""
    lines = [json.dumps({"name": t["function"]["name"], "description": t["function"].get("description") or "",
                         "arguments": t["function"].get("parameters") or NO_ARGUMENTS}) for t in tools]
    return {"role": "system", "content": "\n".join([TOOLS_PREAMBLE, *lines])}
