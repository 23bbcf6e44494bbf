"""The HTTP bridge below FastAPI, at the ASGI layer: the /v1/ guard and client-disconnect watching.

The guard checks the API key, then reads the body itself, counting bytes as chunks arrive, so the size
limit holds with or without Content-Length (chunked transfer encoding); it stops reading past the limit,
and gives up on a body that has not arrived within the read timeout (408: a slow client holds no
connection for long). The app gets the buffered body replayed, and later `receive` calls pass through,
so it still sees `http.disconnect` when the client goes away.
"""

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth import ApiKeys
from gateway.errors import GatewayError
from gateway.http_errors import error_response

log = structlog.get_logger(__name__)

T = TypeVar("T")
_UNEXPECTED_MESSAGE_PAUSE_S = 0.1  # a server that answers `receive` without blocking must not make us spin


GUARDED_ROOT_PATHS = frozenset({"/tokenize", "/detokenize"})  # guarded like /v1/ (vLLM serves them at the root)
OPERATOR_PATHS = frozenset({"/metrics", "/openapi.json"})  # guarded too when the config says so


class BodyTooLarge(Exception):
    """The client sent more than the limit; carries the message of the 413 answer."""


class RequestGuard:
    """ASGI middleware for /v1/ routes (and /tokenize, /detokenize; /metrics and /openapi.json when
    `is_operator_guarded`): 401 without a valid API key, 413 past `max_request_bytes`, 408 when the body takes
    longer than `body_read_timeout_s`."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, max_request_bytes: int, body_read_timeout_s: float = 30.0,
                 is_operator_guarded: bool = False) -> None:
        self.app = app
        self.keys = keys
        self.max_request_bytes = max_request_bytes
        self.body_read_timeout_s = body_read_timeout_s
        self.guarded_paths = GUARDED_ROOT_PATHS | (OPERATOR_PATHS if is_operator_guarded else frozenset())

    def _is_guarded(self, path: str) -> bool:
        return path.startswith("/v1/") or path in self.guarded_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._is_guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            self.keys.check(headers.get("authorization"))
        except GatewayError as e:
            await error_response(401, str(e))(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.body_read_timeout_s):
                body = await self._read_body(receive, headers.get("content-length"))
        except BodyTooLarge as e:
            log.info("request body too large", path=scope["path"], limit=self.max_request_bytes)
            await error_response(413, str(e))(scope, receive, send)
            return
        except TimeoutError:
            log.info("request body too slow", path=scope["path"], timeout_s=self.body_read_timeout_s)
            await error_response(408, f"the request body did not arrive within {self.body_read_timeout_s:g} s",
                                 headers={"Connection": "close"})(scope, receive, send)
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
