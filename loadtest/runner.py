"""Run the load: `concurrency` asyncio workers on `connections` channels, paced by --rps, bounded by -n or -z.

Every call yields one CallResult. A failed call is a result too (its gRPC status), never an
exception out of the run, so a stopped server gives a report full of UNAVAILABLE, not a crash.
Client- and bidi-streaming calls send their data's messages (loadtest/data.py), paced by
--stream-interval and cut by --stream-call-count / --stream-call-duration. A bidi call either sends
while it reads (ghz), or in lockstep: after a message whose `lockstep_field` is set it waits for the
response echoing that value (Speculator.Session's round_id) and records that round trip.
"""

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message
from grpc import aio

from loadtest.call import CallTarget, resolve_call
from loadtest.data import CallContext, CallData, load_call_data, worker_id
from loadtest.errors import LoadTestError
from loadtest.options import LoadOptions


@dataclass
class CallResult:
    start_s: float  # time.time() at the call's start (ghz's detail timestamp)
    latency_s: float
    status: grpc.StatusCode
    error: str = ""  # ghz style: "rpc error: code = Unavailable desc = ..."
    ttft_s: float | None = None  # streams: time to the first message
    token_gaps_s: list[float] = field(default_factory=list)  # streams: mean gap per later token, per message
    num_sent: int = 0  # client / bidi streams: messages sent
    num_received: int = 0  # streams: messages received
    round_trips_s: list[float] = field(default_factory=list)  # lockstep bidi: each message to its reply


@dataclass
class RunResult:
    results: list[CallResult]
    total_s: float
    end_reason: str  # ghz's endReason: "normal" (count reached) or "timeout" (duration elapsed)
    is_streaming: bool  # the method streams its responses (the report adds TTFT and inter-token latency)
    kind: str = "unary"  # unary | server_streaming | client_streaming | bidi


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


@dataclass
class _Call:
    """One call in progress: where it goes, what it sends, what it has seen."""

    channel: aio.Channel
    target: CallTarget
    messages: Iterator[Message]
    opts: LoadOptions
    result: CallResult
    t0: float
    last: float | None = None  # when the previous response arrived

    def received(self, message: Message) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_s = now - self.t0
        else:
            self.result.token_gaps_s.append((now - self.last) / _tokens_in(message))
        self.last = now
        self.result.num_received += 1

    def outgoing(self) -> Iterator[Message]:
        """The stream's messages, cut at --stream-call-count / --stream-call-duration; with either limit the
        data's messages repeat until it is reached."""
        opts = self.opts
        is_limited = bool(opts.stream_call_count) or opts.stream_call_duration_s is not None
        messages = itertools.cycle(list(self.messages)) if is_limited else self.messages
        for i, message in enumerate(messages):
            if opts.stream_call_count and i >= opts.stream_call_count:
                return
            if opts.stream_call_duration_s is not None and time.perf_counter() - self.t0 >= opts.stream_call_duration_s:
                return
            yield message

    async def paced(self) -> AsyncIterator[Message]:
        for i, message in enumerate(self.outgoing()):
            if i and self.opts.stream_interval_s:
                await asyncio.sleep(self.opts.stream_interval_s)
            self.result.num_sent += 1
            yield message

    @property
    def call_options(self) -> dict:
        return {"timeout": self.opts.timeout_s, "metadata": self.opts.metadata or None}


async def _unary(c: _Call) -> None:
    method = c.channel.unary_unary(c.target.path, request_serializer=c.target.request_cls.SerializeToString,
                                   response_deserializer=c.target.response_cls.FromString)
    await method(next(c.messages), **c.call_options)


async def _server_stream(c: _Call) -> None:
    method = c.channel.unary_stream(c.target.path, request_serializer=c.target.request_cls.SerializeToString,
                                    response_deserializer=c.target.response_cls.FromString)
    async for message in method(next(c.messages), **c.call_options):
        c.received(message)


async def _client_stream(c: _Call) -> None:
    method = c.channel.stream_unary(c.target.path, request_serializer=c.target.request_cls.SerializeToString,
                                    response_deserializer=c.target.response_cls.FromString)
    c.received(await method(c.paced(), **c.call_options))


async def _bidi(c: _Call) -> None:
    method = c.channel.stream_stream(c.target.path, request_serializer=c.target.request_cls.SerializeToString,
                                     response_deserializer=c.target.response_cls.FromString)
    call = method(**c.call_options)
    if c.opts.lockstep_field:
        await _lockstep(c, call, c.opts.lockstep_field)
    else:
        async def write_all() -> None:
            async for message in c.paced():
                await call.write(message)
            await call.done_writing()

        await asyncio.gather(write_all(), _read_to_end(c, call))


async def _read_to_end(c: _Call, call: aio.StreamStreamCall) -> None:
    while (message := await call.read()) is not aio.EOF:
        c.received(message)


async def _lockstep(c: _Call, call: aio.StreamStreamCall, key_field: str) -> None:
    """Send a message; if its `key_field` is set, read until the response carrying the same value."""
    async for message in c.paced():
        sent = time.perf_counter()
        await call.write(message)
        key = getattr(message, key_field)
        while key:
            reply = await call.read()
            if reply is aio.EOF:
                raise LoadTestError(f"the stream ended before the reply to {key_field}={key}")
            c.received(reply)
            if getattr(reply, key_field, None) == key:
                c.result.round_trips_s.append(time.perf_counter() - sent)
                break
    await call.done_writing()
    await _read_to_end(c, call)


_KINDS = {"unary": _unary, "server_streaming": _server_stream, "client_streaming": _client_stream, "bidi": _bidi}


async def _one_call(channel: aio.Channel, target: CallTarget, messages: Iterator[Message],
                    opts: LoadOptions) -> CallResult:
    t0 = time.perf_counter()
    result = CallResult(start_s=time.time(), latency_s=0.0, status=grpc.StatusCode.OK)
    try:
        await _KINDS[target.kind](_Call(channel, target, messages, opts, result, t0))
    except aio.AioRpcError as e:
        result.status = e.code()
        result.error = f"rpc error: code = {status_name(e.code())} desc = {e.details()}"
    except LoadTestError as e:  # the server broke the protocol the data assumes
        result.status = grpc.StatusCode.INTERNAL
        result.error = f"rpc error: code = Internal desc = {e}"
    result.latency_s = time.perf_counter() - t0
    return result


class _Schedule:
    """Hands out call slots: stops at -n calls or at the -z deadline; with --rps, slot i starts at i / rps."""

    def __init__(self, opts: LoadOptions, start: float) -> None:
        self.opts = opts
        self.start = start
        self.deadline = start + opts.duration_s if opts.duration_s is not None else None
        self.num_issued = 0

    async def next_slot(self) -> int | None:
        """The next call's request number, or None when the run is over."""
        if self.deadline is None and self.num_issued >= self.opts.total:
            return None
        i = self.num_issued
        self.num_issued += 1
        if self.opts.rps:
            delay = self.start + i / self.opts.rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        return i if self.deadline is None or time.perf_counter() < self.deadline else None


def _check_lockstep(opts: LoadOptions, target: CallTarget) -> None:
    if opts.lockstep_field is None:
        return
    if target.kind != "bidi":
        raise LoadTestError(f"--lockstep-field needs a bidi-streaming call; {opts.call} is {target.kind}")
    for cls in (target.request_cls, target.response_cls):
        if opts.lockstep_field not in cls.DESCRIPTOR.fields_by_name:
            raise LoadTestError(f"--lockstep-field {opts.lockstep_field}: {cls.DESCRIPTOR.full_name} has no such field")


async def run_load(opts: LoadOptions) -> RunResult:
    """Resolve the method and its data, then keep `concurrency` calls in flight until the schedule ends."""
    creds = _credentials(opts)
    target = resolve_call(opts, creds)
    _check_lockstep(opts, target)
    data: CallData = load_call_data(opts, target)
    channels = [aio.secure_channel(opts.host, creds) if creds else aio.insecure_channel(opts.host)
                for _ in range(max(opts.connections, 1))]
    results: list[CallResult] = []
    start = time.perf_counter()
    schedule = _Schedule(opts, start)

    async def worker(index: int) -> None:
        channel = channels[index % len(channels)]
        while (number := await schedule.next_slot()) is not None:
            ctx = CallContext(worker_id(index, len(channels)), number, str(uuid.uuid4()))
            results.append(await _one_call(channel, target, data.messages(number, ctx), opts))

    try:
        await asyncio.gather(*(worker(i) for i in range(max(opts.concurrency, 1))))
    finally:
        for channel in channels:
            await channel.close()
    end_reason = "timeout" if opts.duration_s is not None else "normal"
    return RunResult(results, time.perf_counter() - start, end_reason, target.is_server_streaming, target.kind)
