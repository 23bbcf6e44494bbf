"""Record streams to replay them: a gRPC proxy for the service of `--call` that forwards every call to the host
and writes the request messages of each `--call` stream as one JSON line (a `-D` JSON-lines data file).

Speculator.Session streams are made replayable. The proxied Hello offers INLINE tensors only, so the live
session (and so the recording) carries tensor bytes in its messages, not handles into this node's shared
memory. A target keeps one session for its lifetime; it is cut into one line per busy period, from the first
Prefill after an idle point to the Release that leaves no sequence live, each line starting with the Hello.
"""

import asyncio
import json
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TextIO

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc import aio

from loadtest.call import resolve_call
from loadtest.errors import LoadTestError
from loadtest.options import LoadOptions
from rpc.options import CHANNEL_OPTIONS, SERVER_OPTIONS

SESSION_REQUEST = "ssd.v1.SessionRequest"
_INLINE = 1  # ssd.v1.TensorTransport.TENSOR_TRANSPORT_INLINE
_HOP_HEADERS = ("user-agent", "te", "content-type", "grpc-")  # per-connection metadata, not forwarded


def _as_dict(message: Message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def inline_only(message: Message) -> Message:
    """A Session Hello that offers only INLINE tensors (other messages unchanged)."""
    if message.DESCRIPTOR.full_name == SESSION_REQUEST and message.WhichOneof("kind") == "hello":
        hello = message.hello  # type: ignore[attr-defined]
        del hello.transports[:]
        hello.transports.append(_INLINE)
        hello.ClearField("shm_probe")
        hello.ClearField("cuda_probe")
    return message


class StreamRecorder:
    """One JSON line per stream: every request message, in order."""

    def __init__(self, emit: Callable[[list[dict]], None]) -> None:
        self.emit = emit
        self.messages: list[dict] = []

    def add(self, message: Message) -> None:
        self.messages.append(_as_dict(message))

    def close(self) -> None:
        if self.messages:
            self.emit(self.messages)


class SessionRecorder(StreamRecorder):
    """One JSON line per busy period of a Speculator.Session: the Hello, then rounds and releases up to the
    Release that leaves no sequence live (a stream that ends busy gets a Release of its live sequences)."""

    def __init__(self, emit: Callable[[list[dict]], None]) -> None:
        super().__init__(emit)
        self.hello: dict | None = None
        self.live: set[int] = set()

    def add(self, message: Message) -> None:
        kind = message.WhichOneof("kind")
        if kind == "hello":
            self.hello = _as_dict(message)
            return
        self.messages.append(_as_dict(message))
        if kind == "round":
            self.live |= {p.seq_id for p in message.round.prefills}  # type: ignore[attr-defined]
        elif kind == "release":
            self.live -= set(message.release.seq_ids)  # type: ignore[attr-defined]
            if not self.live:
                self._emit_period()

    def _emit_period(self) -> None:
        if self.hello is not None and any("round" in m for m in self.messages):
            self.emit([self.hello, *self.messages])
        self.messages = []

    def close(self) -> None:
        if self.live:
            self.messages.append({"release": {"seq_ids": sorted(self.live)}})
            self.live = set()
        self._emit_period()


class LineWriter:
    """Appends JSON lines to a file, flushed per line; sets `done` after `max_lines`."""

    def __init__(self, file: TextIO, max_lines: int | None, done: asyncio.Event) -> None:
        self.file = file
        self.max_lines = max_lines
        self.done = done
        self.num_lines = 0

    def __call__(self, messages: list[dict]) -> None:
        if self.done.is_set():
            return
        self.file.write(json.dumps(messages, separators=(",", ":")) + "\n")
        self.file.flush()
        self.num_lines += 1
        if self.max_lines is not None and self.num_lines >= self.max_lines:
            self.done.set()


def _forwarded_metadata(context: aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in context.invocation_metadata() or ()
                 if not k.startswith(":") and not k.startswith(_HOP_HEADERS))


class _Forwarder:
    """Forwards one method to the upstream (its status too, when it fails); records `--call`'s streams."""

    def __init__(self, method: MethodDescriptor, upstream: aio.Channel,
                 recorder_for: Callable[[], StreamRecorder] | None, timeout_s: float) -> None:
        self.method = method
        self.upstream = upstream
        self.recorder_for = recorder_for
        self.timeout_s = timeout_s
        self.request_cls = message_factory.GetMessageClass(method.input_type)
        self.response_cls = message_factory.GetMessageClass(method.output_type)
        self.path = f"/{method.containing_service.full_name}/{method.name}"

    def handler(self) -> grpc.RpcMethodHandler:
        kinds = {(False, False): (grpc.unary_unary_rpc_method_handler, self.unary_unary),
                 (False, True): (grpc.unary_stream_rpc_method_handler, self.unary_stream),
                 (True, False): (grpc.stream_unary_rpc_method_handler, self.stream_unary),
                 (True, True): (grpc.stream_stream_rpc_method_handler, self.stream_stream)}
        make, behaviour = kinds[(self.method.client_streaming, self.method.server_streaming)]
        return make(behaviour, request_deserializer=self.request_cls.FromString,
                    response_serializer=self.response_cls.SerializeToString)

    def _stub(self, kind: str) -> Callable:
        return getattr(self.upstream, kind)(self.path, request_serializer=self.request_cls.SerializeToString,
                                            response_deserializer=self.response_cls.FromString)

    async def _tee(self, requests: AsyncIterator[Message], recorder: StreamRecorder | None) -> AsyncIterator[Message]:
        async for message in requests:
            message = inline_only(message)
            if recorder is not None:
                recorder.add(message)
            yield message

    async def unary_unary(self, request: Message, context: aio.ServicerContext) -> Message:
        try:
            return await self._stub("unary_unary")(request, metadata=_forwarded_metadata(context),
                                                   timeout=self.timeout_s)
        except aio.AioRpcError as e:  # the upstream's status, as if the caller had reached it
            await context.abort(e.code(), e.details())

    async def unary_stream(self, request: Message, context: aio.ServicerContext) -> AsyncIterator[Message]:
        try:
            async for response in self._stub("unary_stream")(request, metadata=_forwarded_metadata(context)):
                yield response
        except aio.AioRpcError as e:
            await context.abort(e.code(), e.details())

    async def stream_unary(self, requests: AsyncIterator[Message], context: aio.ServicerContext) -> Message:
        recorder = self.recorder_for() if self.recorder_for else None
        try:
            return await self._stub("stream_unary")(self._tee(requests, recorder),
                                                    metadata=_forwarded_metadata(context))
        except aio.AioRpcError as e:
            await context.abort(e.code(), e.details())
        finally:
            if recorder is not None:
                recorder.close()

    async def stream_stream(self, requests: AsyncIterator[Message],
                            context: aio.ServicerContext) -> AsyncIterator[Message]:
        recorder = self.recorder_for() if self.recorder_for else None
        try:
            call = self._stub("stream_stream")(self._tee(requests, recorder), metadata=_forwarded_metadata(context))
            async for response in call:
                yield response
        except aio.AioRpcError as e:
            await context.abort(e.code(), e.details())
        finally:
            if recorder is not None:
                recorder.close()


def _service_of(opts: LoadOptions) -> tuple[str, list[MethodDescriptor], MethodDescriptor]:
    creds = None if opts.is_insecure else grpc.ssl_channel_credentials()
    target = resolve_call(opts, creds)
    if not target.is_client_streaming:
        raise LoadTestError(f"--record-to records client- or bidi-streaming calls; {opts.call} is {target.kind}")
    service_name, method_name = target.path.strip("/").split("/")
    pool: descriptor_pool.DescriptorPool = target.request_cls.DESCRIPTOR.file.pool
    service = pool.FindServiceByName(service_name)
    return service_name, list(service.methods), service.methods_by_name[method_name]


async def record_streams(opts: LoadOptions, listen: str, out: Path, max_streams: int | None = None) -> int:
    """Proxy `listen` -> `opts.host` until `max_streams` lines are written, SIGTERM, or Ctrl-C; returns the
    number of lines written to `out` (replaced)."""
    service_name, methods, recorded = _service_of(opts)
    creds = None if opts.is_insecure else grpc.ssl_channel_credentials()
    # the services' own keepalive and message limits on both hops (a target pings its draft while idle)
    upstream = (aio.secure_channel(opts.host, creds, CHANNEL_OPTIONS) if creds
                else aio.insecure_channel(opts.host, CHANNEL_OPTIONS))
    done = asyncio.Event()
    server = aio.server(options=SERVER_OPTIONS)
    with open(out, "w") as file:
        writer = LineWriter(file, max_streams, done)
        is_session = recorded.input_type.full_name == SESSION_REQUEST

        def recorder_for() -> StreamRecorder:
            return SessionRecorder(writer) if is_session else StreamRecorder(writer)

        handlers = {m.name: _Forwarder(m, upstream, recorder_for if m is recorded else None, opts.timeout_s).handler()
                    for m in methods}
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service_name, handlers)])
        try:
            port = server.add_insecure_port(listen)
        except RuntimeError:
            port = 0
        if port == 0:
            await upstream.close()
            raise LoadTestError(f"--listen {listen}: cannot listen there (in use, or not host:port)")
        await server.start()
        if threading.current_thread() is threading.main_thread():  # the command, not a test's thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, done.set)
        try:
            await done.wait()
        finally:
            await server.stop(grace=1.0)
            await upstream.close()
        return writer.num_lines
