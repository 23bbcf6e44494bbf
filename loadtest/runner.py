"""Run the load: `concurrency` asyncio workers on `connections` channels, paced by --rps, bounded by -n or -z.

Every call yields one CallResult. A failed call is a result too (its gRPC status), never an
exception out of the run, so a stopped server gives a report full of UNAVAILABLE, not a crash.
"""

import asyncio
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message
from grpc import aio

from loadtest.call import CallTarget, parse_request, resolve_call
from loadtest.options import LoadOptions


@dataclass
class CallResult:
    start_s: float  # time.time() at the call's start (ghz's detail timestamp)
    latency_s: float
    status: grpc.StatusCode
    error: str = ""  # ghz style: "rpc error: code = Unavailable desc = ..."
    ttft_s: float | None = None  # streams: time to the first message
    token_gaps_s: list[float] = field(default_factory=list)  # streams: mean gap per later token, per message


@dataclass
class RunResult:
    results: list[CallResult]
    total_s: float
    end_reason: str  # ghz's endReason: "normal" (count reached) or "timeout" (duration elapsed)
    is_streaming: bool  # the method streams its responses (the report adds TTFT and inter-token latency)


def status_name(code: grpc.StatusCode) -> str:
    """Go's codes.Code.String(): OK, Unavailable, DeadlineExceeded ... (ghz's status keys)."""
    return "OK" if code == grpc.StatusCode.OK else code.name.title().replace("_", "")


def _credentials(opts: LoadOptions) -> grpc.ChannelCredentials | None:
    return None if opts.is_insecure else grpc.ssl_channel_credentials()


def _tokens_in(message: Message) -> int:
    """Tokens a stream message carries (its `token_ids` field when it has one), at least 1."""
    if "token_ids" in message.DESCRIPTOR.fields_by_name:
        return max(len(message.token_ids), 1)  # type: ignore[attr-defined]
    return 1


async def _unary(channel: aio.Channel, target: CallTarget, request: Message, opts: LoadOptions,
                 result: CallResult, t0: float) -> None:
    method = channel.unary_unary(target.path, request_serializer=target.request_cls.SerializeToString,
                                 response_deserializer=target.response_cls.FromString)
    await method(request, timeout=opts.timeout_s, metadata=opts.metadata or None)


async def _stream(channel: aio.Channel, target: CallTarget, request: Message, opts: LoadOptions,
                  result: CallResult, t0: float) -> None:
    method = channel.unary_stream(target.path, request_serializer=target.request_cls.SerializeToString,
                                  response_deserializer=target.response_cls.FromString)
    last = None
    async for message in method(request, timeout=opts.timeout_s, metadata=opts.metadata or None):
        now = time.perf_counter()
        if last is None:
            result.ttft_s = now - t0
        else:
            result.token_gaps_s.append((now - last) / _tokens_in(message))
        last = now


async def _one_call(channel: aio.Channel, target: CallTarget, request: Message, opts: LoadOptions) -> CallResult:
    t0 = time.perf_counter()
    result = CallResult(start_s=time.time(), latency_s=0.0, status=grpc.StatusCode.OK)
    call = _stream if target.is_server_streaming else _unary
    try:
        await call(channel, target, request, opts, result, t0)
    except aio.AioRpcError as e:
        result.status = e.code()
        result.error = f"rpc error: code = {status_name(e.code())} desc = {e.details()}"
    result.latency_s = time.perf_counter() - t0
    return result


class _Schedule:
    """Hands out call slots: stops at -n calls or at the -z deadline; with --rps, slot i starts at i / rps."""

    def __init__(self, opts: LoadOptions, start: float) -> None:
        self.opts = opts
        self.start = start
        self.deadline = start + opts.duration_s if opts.duration_s is not None else None
        self.num_issued = 0

    async def next_slot(self) -> bool:
        if self.deadline is None and self.num_issued >= self.opts.total:
            return False
        i = self.num_issued
        self.num_issued += 1
        if self.opts.rps:
            delay = self.start + i / self.opts.rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        return self.deadline is None or time.perf_counter() < self.deadline


async def run_load(opts: LoadOptions) -> RunResult:
    """Resolve the method, then keep `concurrency` calls in flight until the schedule ends."""
    creds = _credentials(opts)
    target = resolve_call(opts.call, opts.host, creds)
    request = parse_request(target, opts.data)
    channels = [aio.secure_channel(opts.host, creds) if creds else aio.insecure_channel(opts.host)
                for _ in range(max(opts.connections, 1))]
    results: list[CallResult] = []
    start = time.perf_counter()
    schedule = _Schedule(opts, start)

    async def worker(index: int) -> None:
        channel = channels[index % len(channels)]
        while await schedule.next_slot():
            results.append(await _one_call(channel, target, request, opts))

    try:
        await asyncio.gather(*(worker(i) for i in range(max(opts.concurrency, 1))))
    finally:
        for channel in channels:
            await channel.close()
    end_reason = "timeout" if opts.duration_s is not None else "normal"
    return RunResult(results, time.perf_counter() - start, end_reason, target.is_server_streaming)
