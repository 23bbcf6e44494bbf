"""The Verifier servicer: token-level Generate (server streaming), Abort, GetInfo, GetLoad.

Conversion between proto messages and engine types happens here and nowhere else.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog
from grpc import aio

from protos.ssd.v1 import common_pb2, target_pb2, target_pb2_grpc
from ssd.config import DecodeMode
from ssd.dtypes import dtype_name
from ssd.engine.llm_engine import StepOutput
from ssd.engine.sequence import FinishReason
from ssd.errors import InvalidRequestError
from ssd.sampling.grammar import Grammar
from ssd.sampling.logprobs import TokenLogprob
from ssd.sampling.params import SamplingParams
from ssd.speculation.speculation_stats import SpecStats
from target_service.config import TargetServiceConfig
from target_service.engine_loop import EngineLoop
from target_service.remote_proposer import RemoteProposer
from target_service.tokenizer_files import read_tokenizer_files

log = structlog.get_logger(__name__)

FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
}


MODES = {common_pb2.SPECULATION_MODE_AR: DecodeMode.AR, common_pb2.SPECULATION_MODE_SD: DecodeMode.SD,
         common_pb2.SPECULATION_MODE_SSD: DecodeMode.SSD}  # the one proto <-> engine mode mapping of the target


@dataclass(frozen=True)
class RequestMode:
    """How one request decodes: the engine's mode, and whether it speculates only in batches where the engine
    measured speculation faster than plain steps (auto; ssd/engine/mode_choice.py)."""

    mode: DecodeMode
    adaptive: bool = False


def request_mode(mode: int, default: DecodeMode, adaptive_default: bool = False) -> RequestMode:
    """A request's mode: the one it names, the service's default when it names none (adaptive when the service
    is), or for AUTO the default's speculation (sd when the default is ar) chosen per batch against plain steps;
    InvalidRequestError if unknown."""
    if mode == common_pb2.SPECULATION_MODE_UNSPECIFIED:
        return RequestMode(default, adaptive_default and default is not DecodeMode.AR)
    if mode == common_pb2.SPECULATION_MODE_AUTO:
        return RequestMode(DecodeMode.SD if default is DecodeMode.AR else default, adaptive=True)
    if mode not in MODES:
        raise InvalidRequestError(f"mode must be a SpeculationMode (0-4), got {mode}")
    return RequestMode(MODES[mode])


def token_logprobs_proto(logprobs: list[TokenLogprob] | None) -> list[common_pb2.TokenLogprob]:
    return [common_pb2.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, top_token_ids=[t for t, _ in lp.top],
                                    top_logprobs=[v for _, v in lp.top]) for lp in logprobs or []]


def grammar(g: common_pb2.Grammar) -> Grammar:
    kind = g.WhichOneof("kind")
    if kind is None:
        raise InvalidRequestError("grammar is set but holds none of json_schema, regex, lark")
    return Grammar(kind, getattr(g, kind))


def sampling_params(p: common_pb2.SamplingParams, mode: DecodeMode, adaptive: bool = False) -> SamplingParams:
    """Proto -> engine params for a resolved mode (AR, SD or SSD; adaptive: auto); the engine validates
    (InvalidRequestError -> INVALID_ARGUMENT)."""
    return SamplingParams(
        temperature=p.temperature, top_p=p.top_p or 1.0, top_k=p.top_k, max_tokens=p.max_tokens,
        seed=p.seed if p.HasField("seed") else None, stop_token_ids=tuple(p.stop_token_ids),
        ignore_eos=p.ignore_eos, draft_temperature=p.draft_temperature if p.HasField("draft_temperature") else None,
        logprobs=p.logprobs if p.HasField("logprobs") else None,
        prompt_logprobs=p.prompt_logprobs if p.HasField("prompt_logprobs") else None,
        presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        logit_bias=sorted(p.logit_bias.items()), repetition_penalty=p.repetition_penalty or 1.0, min_p=p.min_p,
        min_tokens=p.min_tokens, grammar=grammar(p.grammar) if p.HasField("grammar") else None,
        mode=mode, adaptive=adaptive)


def spec_stats(stats: SpecStats | None) -> common_pb2.SpeculationStats | None:
    """A request's speculation statistics as the proto."""
    if stats is None:
        return None
    return common_pb2.SpeculationStats(
        num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
        num_accepted_tokens=stats.num_accepted_tokens, num_emitted_tokens=stats.num_emitted_tokens,
        num_cache_hits=stats.num_cache_hits, num_cache_misses=stats.num_cache_misses,
        num_plain_steps=stats.num_plain_steps, num_sd_rounds=stats.num_sd_rounds)


async def _next(stream: asyncio.Queue, deadline: float | None) -> object:
    """The sequence's next output; TimeoutError (DEADLINE_EXCEEDED) once the caller's deadline passed. The
    caller's `finally` then aborts the sequence: its KV is freed and the draft told to release it."""
    if deadline is None:
        return await stream.get()
    try:
        async with asyncio.timeout_at(deadline):
            return await stream.get()
    except TimeoutError:
        raise TimeoutError("the request's deadline passed before it finished") from None


class VerifierServicer(target_pb2_grpc.VerifierServicer):
    def __init__(self, config: TargetServiceConfig, engine_loop: EngineLoop, proposer: RemoteProposer | None) -> None:
        self.config = config
        self.engine_loop = engine_loop
        self.proposer = proposer
        self.requests: dict[str, int] = {}  # request id -> seq id, while running
        info = engine_loop.engine.info
        self.info = target_pb2.TargetInfo(
            model_name=config.engine.model, max_model_len=info.max_model_len, vocab_size=info.vocab_size,
            eos_token_ids=sorted(info.eos_token_ids), tokenizer=read_tokenizer_files(info.model_path),
            modes=[m for m, mode in MODES.items() if proposer or mode is DecodeMode.AR]
            + ([common_pb2.SPECULATION_MODE_AUTO] if proposer else []),
            num_kv_blocks=engine_loop.engine.block_manager.num_blocks,
            block_size=engine_loop.engine.block_manager.block_size,
            dtype=dtype_name(engine_loop.engine.worker.dtype),  # "auto" resolved
            quantization=engine_loop.engine.worker.quantization.describe())  # "auto" resolved

    async def Generate(self, request: target_pb2.VerifierGenerateRequest,
                       context: aio.ServicerContext) -> AsyncIterator[target_pb2.VerifierGenerateResponse]:
        structlog.contextvars.bind_contextvars(request_id=request.request_id)
        mode = request_mode(request.mode, self.config.default_mode, self.config.adaptive)
        params = sampling_params(request.params, mode.mode, mode.adaptive)
        seq_id, stream = await self.engine_loop.add(list(request.prompt_token_ids), params)
        if request.request_id:
            self.requests[request.request_id] = seq_id
        log.info("admitted", seq_id=seq_id, prompt_tokens=len(request.prompt_token_ids),
                 max_tokens=params.max_tokens, mode=params.mode, adaptive=params.adaptive)
        finished, first = False, True
        remaining = context.time_remaining()  # the caller's deadline (None = none)
        deadline = None if remaining is None else asyncio.get_running_loop().time() + remaining
        if deadline is not None and self.proposer is not None:  # the draft learns it with the sequence's Prefill
            self.proposer.deadlines.set(seq_id, time.monotonic() + remaining)
        try:
            while not finished:
                item = await _next(stream, deadline)
                if isinstance(item, Exception):
                    raise item
                out: StepOutput = item
                finished = out.finish_reason is not None
                msg = target_pb2.VerifierGenerateResponse(token_ids=out.new_token_ids,
                                                          logprobs=token_logprobs_proto(out.logprobs))
                if first:
                    msg.num_cached_prompt_tokens = out.num_cached_prompt_tokens
                    msg.prompt_logprobs.extend(token_logprobs_proto(out.prompt_logprobs))
                    first = False
                if finished:
                    msg.finish_reason = FINISH_REASONS[out.finish_reason]
                    stats = spec_stats(out.spec)
                    if stats is not None:
                        msg.spec.CopyFrom(stats)
                yield msg
        finally:
            self.requests.pop(request.request_id, None)
            if self.proposer is not None:
                self.proposer.deadlines.clear(seq_id)
            if not finished:
                log.info("aborted by the caller", seq_id=seq_id)
                self.engine_loop.abort(seq_id)
            structlog.contextvars.unbind_contextvars("request_id")

    async def Abort(self, request: target_pb2.AbortRequest, context: aio.ServicerContext) -> target_pb2.AbortResponse:
        seq_id = self.requests.pop(request.request_id, None)
        if seq_id is not None:
            self.engine_loop.abort(seq_id)
        return target_pb2.AbortResponse(was_running=seq_id is not None)

    async def GetInfo(self, request: target_pb2.TargetInfoRequest, context: aio.ServicerContext) -> target_pb2.TargetInfo:
        return self.info

    async def GetLoad(self, request: common_pb2.LoadRequest, context: aio.ServicerContext) -> common_pb2.Load:
        s = self.engine_loop.load
        return common_pb2.Load(
            num_waiting=s.num_waiting, num_running=s.num_running, num_used_kv_blocks=s.num_used_kv_blocks,
            num_kv_blocks=s.num_kv_blocks, num_outstanding_tokens=s.num_outstanding_tokens,
            num_sequences=len(self.engine_loop.streams), num_drafts=s.num_drafts,
            num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens,
            is_draft_connected=self.proposer is not None and self.proposer.is_connected,
            num_cache_hits=s.num_cache_hits, num_cache_misses=s.num_cache_misses)
