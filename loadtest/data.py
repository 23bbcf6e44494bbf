"""ghz's call data: `-d` JSON or a `-D` file, with ghz's call templates (`{{.RequestNumber}}`, `{{newUUID}}`, ...).

A source is the text of `-d`, of a JSON file, or of one line of a JSON-lines file (`.jsonl` / `.ndjson`). Call
number i uses source i mod n. Its value is a JSON object (one message) or an array: for a client- or
bidi-streaming call the messages of the stream, for the others (as in ghz) items used round-robin. So a
JSON-lines file of recorded Speculator.Session streams (loadtest/record.py) replays one recorded stream per call.

Templates are rendered on a source's text before it is parsed, once per call (or once per message with
`--stream-dynamic-messages`); a source without `{{` is parsed once and reused.
"""

import json
import random
import re
import string
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf.message import Message

from loadtest.call import CallTarget, parse_message
from loadtest.errors import LoadTestError
from loadtest.options import LoadOptions

_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class CallContext:
    """What a call's templates can name (ghz's call template data)."""

    worker_id: str  # ghz's spelling: "g<worker>c<connection>"
    request_number: int  # 0-based, over the whole run
    call_uuid: str  # ghz's .UUID: one per call


def _fields(target: CallTarget, ctx: CallContext) -> dict[str, str]:
    service, _, method = target.path.strip("/").partition("/")
    now = time.time_ns()
    return {
        "WorkerID": ctx.worker_id, "RequestNumber": str(ctx.request_number), "UUID": ctx.call_uuid,
        "FullyQualifiedName": f"{service}.{method}", "MethodName": method, "ServiceName": service,
        "InputName": target.request_cls.DESCRIPTOR.full_name, "OutputName": target.response_cls.DESCRIPTOR.full_name,
        "IsClientStreaming": str(target.is_client_streaming).lower(),
        "IsServerStreaming": str(target.is_server_streaming).lower(),
        "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now / 1e9)),
        "TimestampUnix": str(now // 10**9), "TimestampUnixMilli": str(now // 10**6), "TimestampUnixNano": str(now),
    }


def _function(words: list[str]) -> str:
    """ghz's template functions: newUUID, randomString N, randomInt MIN MAX (MIN <= n < MAX)."""
    name, args = words[0], words[1:]
    try:
        if name == "newUUID" and not args:
            return str(uuid.uuid4())
        if name == "randomString" and len(args) == 1:
            return "".join(random.choices(string.ascii_letters + string.digits, k=int(args[0])))
        if name == "randomInt" and len(args) == 2:
            return str(random.randrange(int(args[0]), int(args[1])))
    except ValueError:
        pass
    raise LoadTestError(f"unknown call template {{{{{' '.join(words)}}}}}; known: .RequestNumber, .WorkerID, "
                        ".UUID, .Timestamp..., newUUID, randomString N, randomInt MIN MAX")


def render(text: str, target: CallTarget, ctx: CallContext) -> str:
    """`text` with every `{{...}}` replaced by its value."""
    fields = _fields(target, ctx)

    def one(match: re.Match) -> str:
        expression = match[1]
        if expression.startswith("."):
            if expression[1:] not in fields:
                raise LoadTestError(f"unknown call template field {{{{{expression}}}}}; known: "
                                    f"{', '.join('.' + f for f in fields)}")
            return fields[expression[1:]]
        return _function(expression.split())

    return _TEMPLATE.sub(one, text)


def read_sources(opts: LoadOptions) -> list[str]:
    """The texts call i picks from (i mod n): -d, a JSON file, or the non-empty lines of a JSON-lines file."""
    if opts.data_file is None:
        return [opts.data or "{}"]
    try:
        text = opts.data_file.read_text()
    except OSError as e:
        raise LoadTestError(f"-D {opts.data_file}: {e.strerror}") from None
    if opts.data_file.suffix not in _JSON_LINES_SUFFIXES:
        return [text]
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise LoadTestError(f"-D {opts.data_file} has no lines")
    return lines


class CallData:
    """The messages of each call."""

    def __init__(self, sources: list[str], target: CallTarget, opts: LoadOptions) -> None:
        self.sources = sources
        self.target = target
        self.opts = opts
        self._parsed: dict[int, list[Message]] = {}  # source index -> its messages, for untemplated sources
        for i, source in enumerate(sources):  # fail before the run: malformed JSON or templates
            value = self._value(source, CallContext("g0c0", 0, str(uuid.uuid4())), where=self._where(i))
            if "{{" not in source:
                self._parsed[i] = self._messages_of(value, self._where(i))

    def _where(self, index: int) -> str:
        if self.opts.data_file is None:
            return "-d"
        return f"-D {self.opts.data_file}" + (f" line {index + 1}" if len(self.sources) > 1 else "")

    def _value(self, source: str, ctx: CallContext, where: str) -> object:
        try:
            return json.loads(render(source, self.target, ctx) if "{{" in source else source)
        except json.JSONDecodeError as e:
            raise LoadTestError(f"{where} is not JSON: {e}") from None

    def _messages_of(self, value: object, where: str) -> list[Message]:
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(item, dict) for item in items):
            raise LoadTestError(f"{where} must be a JSON object or a non-empty array of objects")
        return [parse_message(self.target, item, where) for item in items]

    def messages(self, request_number: int, ctx: CallContext) -> Iterator[Message]:
        """Call `request_number`'s messages: one for a unary-request call (round-robin over an array), the
        stream's for a client- or bidi-streaming one; templates rendered now (per message when dynamic)."""
        index = request_number % len(self.sources)
        where = self._where(index)
        is_dynamic = self.opts.is_stream_dynamic and index not in self._parsed
        if is_dynamic and self.target.is_client_streaming:
            yield from self._dynamic(index, ctx, where)
            return
        parsed = self._parsed.get(index)
        if parsed is None:
            parsed = self._messages_of(self._value(self.sources[index], ctx, where), where)
        if self.target.is_client_streaming:
            yield from parsed
        else:
            yield parsed[request_number % len(parsed)]

    def _dynamic(self, index: int, ctx: CallContext, where: str) -> Iterator[Message]:
        position = 0
        while True:
            fresh = CallContext(ctx.worker_id, ctx.request_number, str(uuid.uuid4()))
            items = self._messages_of(self._value(self.sources[index], fresh, where), where)
            if position >= len(items):
                return
            yield items[position]
            position += 1


def load_call_data(opts: LoadOptions, target: CallTarget) -> CallData:
    return CallData(read_sources(opts), target, opts)


def worker_id(worker: int, num_connections: int) -> str:
    return f"g{worker}c{worker % max(num_connections, 1)}"
