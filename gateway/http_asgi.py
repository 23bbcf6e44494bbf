"""The HTTP bridge below FastAPI, at the ASGI layer: the /v1/ guard and client-disconnect watching.

The guard checks the API key, then reads the body itself, counting bytes as chunks arrive, so the size
limit holds with or without Content-Length (chunked transfer encoding); it stops reading past the limit.
The app gets the buffered body replayed, and later `receive` calls pass through, so it still sees
`http.disconnect` when the client goes away.
"""

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth import ApiKeys
from gateway.errors import GatewayError, openai_error_body

log = structlog.get_logger(__name__)

T = TypeVar("T")
_UNEXPECTED_MESSAGE_PAUSE_S = 0.1  # a server that answers `receive` without blocking must not make us spin


GUARDED_ROOT_PATHS = frozenset({"/tokenize", "/detokenize"})  # guarded like /v1/ (vLLM serves them at the root)


class BodyTooLarge(Exception):
    """The client sent more than the limit; carries the message of the 413 answer."""


class RequestGuard:
    """ASGI middleware for /v1/ routes (and /tokenize, /detokenize): 401 without a valid API key, 413 past
    `max_request_bytes`."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, max_request_bytes: int) -> None:
        self.app = app
        self.keys = keys
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"].startswith("/v1/") or scope["path"] in GUARDED_ROOT_PATHS):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self.keys.check(headers.get("authorization"))
        except GatewayError as e:
            await _error(401, str(e))(scope, receive, send)
            return
        try:
            body = await self._read_body(receive, headers.get("content-length"))
        except BodyTooLarge as e:
            log.info("request body too large", path=scope["path"], limit=self.max_request_bytes)
            await _error(413, str(e))(scope, receive, send)
            return
        if body is None:  # the client left before sending the whole body: nobody to answer
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive, content_length: str | None) -> bytes | None:
        """The whole body, or None when the client disconnected first; raises BodyTooLarge past the limit."""
        limit = self.max_request_bytes
        if content_length is not None and content_length.isdigit() and int(content_length) > limit:
            raise BodyTooLarge(f"the request body has {int(content_length)} bytes; {_at_most(limit)}")
        chunks, num_bytes = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > limit:  # stop reading: the rest is never buffered
                raise BodyTooLarge(f"the request body has more than {limit} bytes; {_at_most(limit)}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _at_most(limit: int) -> str:
    return f"at most {limit} are allowed"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(openai_error_body(status, message), status_code=status)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the buffered body once, then the server's own messages (http.disconnect)."""
    is_replayed = False

    async def replay() -> Message:
        nonlocal is_replayed
        if is_replayed:
            return await receive()
        is_replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def until_disconnected(receive: Receive) -> None:
    """Return once the client has gone away. Event-driven: after the body, `receive` blocks until then."""
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(_UNEXPECTED_MESSAGE_PAUSE_S)


async def unless_disconnected(work: Coroutine[Any, Any, T], receive: Receive) -> T | None:
    """Run `work` while watching the connection; None when the client left first.

    On a disconnect `work` is cancelled and awaited, so its cleanup (cancelling the target call, which
    aborts the sequence and frees its KV on the target and the draft) has run when this returns.
    """
    task = asyncio.create_task(work)
    watcher = asyncio.create_task(until_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return None
    return task.result()  # raises what `work` raised (GatewayError -> its HTTP status)
