"""The OpenAI response bodies of one request: the whole completion, or its stream chunks (chat or completions).

One `OpenAIResponse` per request holds what every body repeats (id, object, created, model) and the per-choice
state a stream needs (completions' logprobs count characters across chunks; a tool call's text until it is whole).
With function calling (a `ToolPlan`) a chat answer is returned as `tool_calls`: a named call's arguments stream as
they come; "required" calls are sent whole with the last chunk; "auto" streams text up to a call tag.
"""

import time
from collections.abc import Callable

from gateway.choices import combined
from gateway.generation import TextDelta
from gateway.logprobs_format import chat_logprobs, completion_logprobs, merged
from gateway.tokenizer import TextTokenizer
from gateway.tool_calls import ToolPlan, outside_calls, streamable, tool_call


def usage(d: TextDelta) -> dict:
    out = {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
           "total_tokens": d.prompt_tokens + d.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": d.cached_prompt_tokens}}
    if d.spec is not None:  # extension: per-request speculation stats
        out["speculation"] = {"num_drafts": d.spec.num_drafts, "num_draft_tokens": d.spec.num_draft_tokens,
                              "num_accepted_tokens": d.spec.num_accepted_tokens}
        if d.spec.num_cache_hits or d.spec.num_cache_misses:  # ssd: the draft's speculation cache
            out["speculation"].update(num_cache_hits=d.spec.num_cache_hits, num_cache_misses=d.spec.num_cache_misses)
        if d.spec.num_plain_steps:  # mode auto: the steps the target took plainly (num_drafts: those it speculated)
            out["speculation"]["num_plain_steps"] = d.spec.num_plain_steps
        if d.spec.num_sd_rounds:  # mode auto, ssd: rounds speculated as plain SD, without the draft's cache
            out["speculation"]["num_sd_rounds"] = d.spec.num_sd_rounds
    return out


class OpenAIResponse:
    def __init__(self, request_id: str, model: str, chat: bool, num_choices: int, wants_logprobs: bool,
                 tokenizer: Callable[[], TextTokenizer], echoes: list[str] | None = None,
                 tools: ToolPlan | None = None, continuous_usage: bool = False) -> None:
        """`echoes`: completions' echo=true: per choice, the prompt text its text (and logprobs) starts with.
        `tools`: chat answers are tool calls. `continuous_usage`: every stream chunk carries its choice's usage."""
        self.continuous_usage = continuous_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = self.object + (".chunk" if chat else "")
        self.created, self.model, self.chat = int(time.time()), model, chat
        self.wants_logprobs = wants_logprobs
        self.tokenizer = tokenizer
        self.text_offsets = [0] * num_choices  # completions' logprobs count characters across chunks
        self.echoes = echoes
        self.echoed = [False] * num_choices  # streams echo the prompt in each choice's first chunk
        self.tools = tools if chat else None
        self.call_text = [""] * num_choices  # streamed tool calls: each choice's answer so far
        self.call_ids: list[str | None] = [None] * num_choices  # a streamed named call's id, once opened
        self.text_sent = [0] * num_choices  # streamed "auto" answers: characters already sent as content

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, i: int, d: TextDelta) -> dict | None:
        if not self.wants_logprobs:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer(), d.logprobs)
        out = completion_logprobs(self.tokenizer(), d.logprobs, self.text_offsets[i])
        self.text_offsets[i] += sum(len(t) for t in out["tokens"])
        return out

    def _text_and_logprobs(self, i: int, d: TextDelta) -> tuple[str, dict | None]:
        """Choice i's text and logprobs for this delta, led by the echoed prompt the first time."""
        if self.echoes is None or self.echoed[i]:
            return d.text, self._logprobs(i, d)
        self.echoed[i] = True
        if not self.wants_logprobs or not d.prompt_token_ids:
            return self.echoes[i] + d.text, self._logprobs(i, d)
        prompt = completion_logprobs(self.tokenizer(), d.prompt_logprobs, 0, unscored_first=d.prompt_token_ids[0])
        self.text_offsets[i] = sum(len(t) for t in prompt["tokens"])
        return self.echoes[i] + d.text, merged(prompt, self._logprobs(i, d))

    def whole(self, done: list[TextDelta], groups: list[list[TextDelta]]) -> dict:
        """The non-streamed body: every choice's whole completion; usage over `groups` (every prompt's candidates,
        so best_of's discarded ones are counted)."""
        choices = []
        for i, d in enumerate(done):
            text, logprobs = self._text_and_logprobs(i, d)
            choice = {"index": i, "finish_reason": d.finish_reason, "logprobs": logprobs}
            content, calls = self.tools.parse(text) if self.tools is not None else (text, None)
            if calls is not None:
                choice |= {"message": {"role": "assistant", "content": content, "tool_calls": calls},
                           "finish_reason": self.tools.finish_reason(d.finish_reason)}
            else:
                choice |= {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
            choices.append(choice)
        return self._head(self.object) | {"choices": choices, "usage": usage(combined(groups))}

    def role_chunk(self, i: int) -> dict:
        """Chat streams open each choice with the assistant role."""
        return self._head(self.chunk_object) | {
            "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}

    def chunk(self, i: int, d: TextDelta) -> dict:
        text, logprobs = self._text_and_logprobs(i, d)
        choice = {"index": i, "finish_reason": d.finish_reason, "logprobs": logprobs}
        if self.tools is not None:
            choice["delta"], choice["finish_reason"] = self._call_delta(self.tools, i, text, d.finish_reason)
        else:
            choice |= {"delta": {"content": text}} if self.chat else {"text": text}
        body = self._head(self.chunk_object) | {"choices": [choice]}
        if self.continuous_usage:
            body["usage"] = {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
                             "total_tokens": d.prompt_tokens + d.completion_tokens}
        return body

    def _call_delta(self, plan: ToolPlan, i: int, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """A tool-call stream's delta and finish reason: a named call opens with its id and name, then streams
        its arguments; "required" calls are held until the answer is whole (then sent, or its text if cut off);
        "auto" streams text until a call tag, then holds the rest until the answer is whole."""
        self.call_text[i] += text
        if plan.choice == "named":
            if self.call_ids[i] is None:
                call = tool_call(str(plan.named), text)
                self.call_ids[i] = call["id"]
                return {"tool_calls": [{"index": 0, **call}]}, finish_reason
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]} if text else {}, finish_reason
        sent, whole = self.text_sent[i], self.call_text[i]
        if finish_reason is None:
            n = streamable(whole[sent:]) if plan.choice == "auto" else 0
            self.text_sent[i] += n
            return ({"content": whole[sent : sent + n]} if n else {}), None
        _, calls = plan.parse(whole)
        if calls is None:
            return {"content": whole[sent:]}, finish_reason
        rest = outside_calls(whole[sent:])  # content not streamed yet (none before the first tag is left)
        delta = {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]}
        return delta | ({"content": rest} if rest else {}), plan.finish_reason(finish_reason)

    def usage_chunk(self, groups: list[list[TextDelta]]) -> dict:
        """`stream_options.include_usage`: a last chunk without choices, usage over all of them (a group per prompt)."""
        return self._head(self.chunk_object) | {"choices": [], "usage": usage(combined(groups))}
