"""The public Generation gRPC API: the same TextGenerator as the HTTP bridge, proto in and out.

Requests are checked as the HTTP bridge checks them (INVALID_ARGUMENT), admitted through the same bounded
queue (RESOURCE_EXHAUSTED, with a `retry-after` trailer in seconds), and the client's gRPC deadline becomes
the target call's (DEADLINE_EXCEEDED).
"""

import math
from collections.abc import AsyncIterator

from grpc import aio

from gateway.admission import Admission
from gateway.auth import ApiKeys
from gateway.errors import InvalidRequest, Overloaded, RequestTooLarge
from gateway.generation import MODES, TextDelta, TextGenerator, TextRequest
from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

FINISH_CODES = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH,
                "abort": common_pb2.FINISH_REASON_ABORT, None: common_pb2.FINISH_REASON_UNSPECIFIED}
MODE_NAMES = {number: name for name, number in MODES.items()}  # proto -> the HTTP names, the one mapping inverted
CHAT_ROLES = frozenset({"system", "user", "assistant", "developer"})  # "tool" needs a tool_call_id the proto lacks


def _messages(chat: gateway_pb2.ChatMessages) -> list[dict]:
    if not chat.messages:
        raise InvalidRequest("the chat has no messages", param="chat")
    for i, m in enumerate(chat.messages):
        if m.role not in CHAT_ROLES:
            raise InvalidRequest(f"chat message {i}: the role must be one of {', '.join(sorted(CHAT_ROLES))}, got "
                                 f"{m.role[:40]!r}", param="chat")
    return [{"role": m.role, "content": m.content} for m in chat.messages]


def _text_request(req: gateway_pb2.GenerateRequest, deadline: float | None = None) -> TextRequest:
    which = req.WhichOneof("input")
    if which is None:
        raise InvalidRequest("a GenerateRequest needs a prompt or chat messages")
    if req.max_tokens < 0:
        raise InvalidRequest(f"max_tokens must be >= 1, got {req.max_tokens}")
    if req.HasField("truncate_prompt_tokens") and req.truncate_prompt_tokens < 1:
        raise InvalidRequest(f"truncate_prompt_tokens must be >= 1, got {req.truncate_prompt_tokens}")
    if req.mode not in MODE_NAMES:
        raise InvalidRequest(f"mode must be a SpeculationMode (0-{max(MODE_NAMES)}), got {req.mode}", param="mode")
    params = common_pb2.SamplingParams(temperature=req.temperature, top_p=req.top_p or 1.0, top_k=req.top_k,
                                       max_tokens=req.max_tokens, presence_penalty=req.presence_penalty,
                                       frequency_penalty=req.frequency_penalty, logit_bias=req.logit_bias,
                                       repetition_penalty=req.repetition_penalty, min_p=req.min_p,
                                       min_tokens=req.min_tokens, stop_token_ids=req.stop_token_ids)
    if req.HasField("seed"):
        params.seed = req.seed
    if req.HasField("grammar"):
        params.grammar.CopyFrom(req.grammar)
    if req.HasField("logprobs"):
        params.logprobs = req.logprobs
    if req.HasField("prompt_logprobs"):
        params.prompt_logprobs = req.prompt_logprobs
    messages = _messages(req.chat) if which == "chat" else None
    return TextRequest(req.model or None, req.prompt if which == "prompt" else None, messages, params,
                       tuple(req.stop), MODE_NAMES[req.mode], include_stop=req.include_stop_str_in_output,
                       truncate_prompt_tokens=req.truncate_prompt_tokens if req.HasField("truncate_prompt_tokens")
                       else None, deadline=deadline)


def _usage(d: TextDelta) -> gateway_pb2.Usage:
    return gateway_pb2.Usage(prompt_tokens=d.prompt_tokens, completion_tokens=d.completion_tokens,
                             cached_prompt_tokens=d.cached_prompt_tokens)


class GenerationServicer(gateway_pb2_grpc.GenerationServicer):
    def __init__(self, generator: TextGenerator, keys: ApiKeys, admission: Admission) -> None:
        self.generator = generator
        self.keys = keys
        self.admission = admission

    def _auth(self, context: aio.ServicerContext) -> str:
        """The caller's API key (checked), the admission's per-key identity."""
        return self.keys.check(dict(context.invocation_metadata() or ()).get("authorization"))

    def _checked(self, request: gateway_pb2.GenerateRequest, context: aio.ServicerContext) -> TextRequest:
        limit = self.generator.config.max_grpc_message_bytes
        if request.ByteSize() > limit:
            raise RequestTooLarge(f"the request has {request.ByteSize()} bytes; at most {limit} are allowed")
        return _text_request(request, self.generator.deadline(context.time_remaining()))

    async def _admit(self, key: str, req: TextRequest, context: aio.ServicerContext):  # noqa: ANN202
        try:
            return await self.admission.admit(key, req.deadline)
        except Overloaded as e:
            context.set_trailing_metadata((("retry-after", str(max(1, math.ceil(e.retry_after_s)))),))
            raise

    async def Generate(self, request: gateway_pb2.GenerateRequest,
                       context: aio.ServicerContext) -> gateway_pb2.GenerateResponse:
        key = self._auth(context)
        req = self._checked(request, context)
        ticket = await self._admit(key, req, context)
        try:
            d = await self.generator.complete(req)
        finally:
            ticket.release()
        out = gateway_pb2.GenerateResponse(request_id=req.request_id, text=d.text,
                                           finish_reason=FINISH_CODES[d.finish_reason], usage=_usage(d),
                                           logprobs=d.logprobs, prompt_logprobs=d.prompt_logprobs)
        if d.spec is not None:
            out.spec.CopyFrom(d.spec)
        return out

    async def GenerateStream(self, request: gateway_pb2.GenerateRequest,
                             context: aio.ServicerContext) -> AsyncIterator[gateway_pb2.GenerateStreamResponse]:
        key = self._auth(context)
        req = self._checked(request, context)
        ticket = await self._admit(key, req, context)
        try:
            async for d in self.generator.stream(req):
                msg = gateway_pb2.GenerateStreamResponse(request_id=req.request_id, text=d.text,
                                                         token_ids=d.token_ids,
                                                         finish_reason=FINISH_CODES[d.finish_reason],
                                                         logprobs=d.logprobs, prompt_logprobs=d.prompt_logprobs)
                if d.finish_reason is not None:
                    msg.usage.CopyFrom(_usage(d))
                    if d.spec is not None:
                        msg.spec.CopyFrom(d.spec)
                yield msg
        finally:
            ticket.release()

    async def ListModels(self, request: gateway_pb2.ListModelsRequest,
                         context: aio.ServicerContext) -> gateway_pb2.ListModelsResponse:
        self._auth(context)
        return gateway_pb2.ListModelsResponse(models=[self.generator.model_name])
