"""Function calling (OpenAI `tools` / `tool_choice` on chat completions), built on structured output.

A named tool choice and "required" are grammars: the answer is the named function's arguments (a JSON object
following its `parameters` schema), or a JSON array of one or more `{"name": ..., "arguments": {...}}` calls,
each naming one of the tools and following that tool's schema. So every call parses and fits its function,
and the response carries it as `tool_calls` instead of text. "auto" (the default with tools: the model decides)
has no grammar: the model writes text, calls in Hermes-style tags (`<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, the format of Qwen and Hermes templates), or both; the tags are parsed out, and an answer
whose tags do not parse into calls of known tools is returned as text. "none" answers in text, without the
tools in the prompt.

The tools reach the chat template as `tools` (a template that knows them renders them); a template that does
not mention tools gets them in a system message instead (with the tag format for "auto"), so the model reads
their names and descriptions.
"""

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from gateway.errors import InvalidRequest

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS_PREAMBLE = ("You can call these functions. Each is given as JSON: its name, what it does and a JSON schema of "
                  "its arguments.")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
AUTO_INSTRUCTIONS = (f'To call a function, answer with {CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{CALL_CLOSE}, '
                     "one per call; otherwise answer as usual.")
_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.DOTALL)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments; None = no arguments
    strict: StrictBool | None = None  # the schema is always enforced

    def schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters else NO_ARGUMENTS


class Tool(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = ConfigDict(strict=True)

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(strict=True)

    name: str
    arguments: str  # JSON text, as OpenAI sends it back


class ToolCall(BaseModel):
    model_config = ConfigDict(strict=True)

    """A call in an assistant message of the conversation so far."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


@dataclass(frozen=True)
class ToolPlan:
    """How a request's answer becomes tool calls: the arguments of `named`, every call of a JSON array
    ("required"), or the tagged calls in free text ("auto")."""

    choice: Literal["named", "required", "auto"]
    schema: dict[str, Any] | None  # the answer's JSON schema (the request's grammar); None for "auto"
    named: str | None = None  # the function a named tool choice forces
    names: frozenset[str] = frozenset()  # the tools' names ("auto" checks the calls against them)

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
        """(content, tool_calls) of an answer; no calls (None) when a "required" answer holds no whole array (cut
        off by max_tokens or a stop string: the grammar makes every finished answer parse) or when an "auto"
        answer's tags do not hold calls of known tools. Content is the text outside the calls (None if empty)."""
        if self.choice == "named":  # cut off or not, the text is the call's arguments (as OpenAI returns them)
            return None, [tool_call(str(self.named), text)]
        if self.choice == "required":
            try:
                return None, [tool_call(c["name"], json.dumps(c["arguments"])) for c in json.loads(text)]
            except json.JSONDecodeError:
                return text, None
        blocks = _CALL_BLOCK.findall(text)
        calls = [call for call in map(self._tagged_call, blocks) if call is not None]
        if not blocks or len(calls) < len(blocks):
            return text, None
        return outside_calls(text) or None, calls

    def _tagged_call(self, block: str) -> dict[str, Any] | None:
        """A tag's call: JSON naming one of the tools, its arguments an object (or JSON text of one)."""
        try:
            call = json.loads(block)
            name, arguments = call["name"], call.get("arguments", call.get("parameters", {}))
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
        except (json.JSONDecodeError, TypeError, KeyError):
            return None
        if not isinstance(name, str) or name not in self.names or not isinstance(arguments, dict):
            return None
        return tool_call(name, json.dumps(arguments))

    def finish_reason(self, finish_reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" when the model chose to call, "stop" when the call was forced (named)."""
        return "tool_calls" if finish_reason == "stop" and self.choice != "named" else finish_reason


def outside_calls(text: str) -> str:
    """The text of an "auto" answer around its call tags, stripped."""
    return _CALL_BLOCK.sub("", text).strip()


def streamable(text: str) -> int:
    """How much of an "auto" answer's unsent text can go out as content now: up to a call tag, holding back a
    tail that could still become one."""
    at = text.find(CALL_OPEN)
    if at >= 0:
        return at
    held = next((n for n in range(min(len(text), len(CALL_OPEN) - 1), 0, -1) if CALL_OPEN.startswith(text[-n:])), 0)
    return len(text) - held


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
        return ToolPlan("auto", None, names=frozenset(by_name))
    if isinstance(choice, NamedToolChoice):
        function = by_name.get(choice.function.name)
        if function is None:
            raise InvalidRequest(f"tool_choice names {choice.function.name!r}, which is not among the tools",
                                 param="tool_choice")
        return ToolPlan("named", function.schema(), named=function.name)
    call = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
             "properties": {"name": {"const": f.name}, "arguments": f.schema()}} for f in by_name.values()]
    array = {"type": "array", "minItems": 1, "items": call[0] if len(call) == 1 else {"anyOf": call}}
    return ToolPlan("required", array if parallel else array | {"maxItems": 1})


def tools_message(tools: list[dict[str, Any]], tagged: bool) -> dict[str, str]:
    """The tools as a system message, for a chat template that does not render `tools` itself; `tagged`: the
    model chooses ("auto") and is told the call format."""
    lines = [json.dumps({"name": t["function"]["name"], "description": t["function"].get("description") or "",
                         "arguments": t["function"].get("parameters") or NO_ARGUMENTS}) for t in tools]
    return {"role": "system", "content": "\n".join([TOOLS_PREAMBLE, *lines, *([AUTO_INSTRUCTIONS] if tagged else [])])}
