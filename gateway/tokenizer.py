"""Text <-> token ids with the `tokenizers` library and the model's Jinja chat template (no transformers, no torch).

Matches the engine's tokenizer: encode without special tokens, decode skipping them, the chat
template rendered as transformers renders it (sandboxed, trim_blocks, lstrip_blocks).
"""

import json
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from gateway.errors import InvalidRequest
from gateway.tool_calls import tools_message
from protos.ssd.v1 import target_pb2


def _raise(message: str) -> None:
    raise InvalidRequest(message)


@dataclass(frozen=True)
class ChatRender:
    """How chat messages become a prompt, beyond the messages (vLLM's chat extensions and function calling)."""

    tools: list[dict[str, Any]] | None = None  # function calling: the tools, for the template
    tool_tags: bool = False  # tool_choice "auto": the model writes its calls in tags (told so if need be)
    add_generation_prompt: bool = True  # open the assistant's turn
    continue_final_message: bool = False  # the prompt ends inside the last (assistant) message: the model goes on
    template_kwargs: dict[str, Any] | None = None  # more template variables (e.g. Qwen3's enable_thinking)


def continued(text: str, final: dict[str, Any]) -> str:
    """The rendered conversation cut right after the final message's content."""
    content = final.get("content") or ""
    at = text.rfind(content) if content else -1
    if at < 0:
        raise InvalidRequest("continue_final_message: the chat template does not render the last message's content "
                             "as it is, so there is no place to continue it from", param="messages")
    return text[: at + len(content)]


class TextTokenizer:
    def __init__(self, files: target_pb2.TokenizerFiles) -> None:
        if not files.tokenizer_json:
            raise InvalidRequest("the served model has no tokenizer; text prompts are not available")
        self._tok = Tokenizer.from_str(files.tokenizer_json.decode())
        self.bos_token, self.eos_token = files.bos_token, files.eos_token
        self._template = None
        self.template_knows_tools = "tools" in files.chat_template  # renders `tools` itself
        self.template_knows_tool_calls = "tool_calls" in files.chat_template  # renders assistant tool calls
        if files.chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(files.chat_template)

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it works (encode does not): the event loop goes on meanwhile
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (a piece of a multi-byte character decodes to U+FFFD)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def chat_prompt(self, messages: list[dict[str, Any]], render: ChatRender | None = None) -> str:
        """The template rendered for the next assistant turn (or, with `continue_final_message`, up to the end of
        the last assistant message, for the model to go on with it). Tools (function calling) go to the template,
        or, when it does not render tools, into a system message (telling the call tags under "auto"); past tool
        calls into the assistant's content likewise."""
        render = render or ChatRender()
        if self._template is None:
            raise InvalidRequest("this model has no chat template; use /v1/completions with a prompt")
        if not self.template_knows_tool_calls:
            messages = [with_calls_as_text(m) for m in messages]
        tools = render.tools
        if tools and not self.template_knows_tools:
            messages, tools = with_tools_message(messages, tools, render.tool_tags), None
        variables = {**(render.template_kwargs or {}), "messages": messages, "bos_token": self.bos_token,
                     "eos_token": self.eos_token, **({"tools": tools} if tools else {}),
                     "add_generation_prompt": render.add_generation_prompt and not render.continue_final_message}
        try:
            text = self._template.render(**variables)
        except jinja2.TemplateError as e:
            raise InvalidRequest(f"the chat template rejected the messages: {e}") from e
        return continued(text, messages[-1]) if render.continue_final_message else text


def with_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's tool calls written into its content, as JSON (for a template that drops them)."""
    if not message.get("tool_calls"):
        return message
    calls = json.dumps([{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                        for c in message["tool_calls"]])
    content = f"{message['content']}\n{calls}" if message.get("content") else calls
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}


def with_tools_message(messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       tagged: bool) -> list[dict[str, Any]]:
    """The tools described in the system message (added after the conversation's own system text, if any)."""
    described = tools_message(tools, tagged)
    if messages and messages[0]["role"] == "system":
        first = messages[0] | {"content": f"{messages[0]['content']}\n\n{described['content']}"}
        return [first, *messages[1:]]
    return [described, *messages]


class IncrementalDetokenizer:
    """Token ids in, text deltas out; holds back an incomplete UTF-8 character until it completes."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""

    def push(self, new_ids: list[int]) -> str:
        self.token_ids.extend(new_ids)
        full = self.tokenizer.decode(self.token_ids)
        if full.endswith("\ufffd"):
            return ""
        delta, self.text = full[len(self.text) :], full
        return delta


class StopStrings:
    """Cuts the text before the first stop string (after it with `include`, vLLM's include_stop_str_in_output);
    holds back a tail that could still start one."""

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.is_stopped = False

    def push(self, delta: str, is_last: bool = False) -> str:
        """Text safe to emit now; sets is_stopped when a stop string appeared."""
        self.pending += delta
        hits = [(at, -len(stop)) for stop in self.stops if (at := self.pending.find(stop)) >= 0]
        if hits:
            self.is_stopped = True
            at, minus_len = min(hits)  # the first stop string; the longest of those starting there
            out, self.pending = self.pending[: at - minus_len if self.include else at], ""
            return out
        if is_last or not self.hold:
            out, self.pending = self.pending, ""
            return out
        cut = max(0, len(self.pending) - self.hold)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out
