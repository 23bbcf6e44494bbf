"""Every HTTP error answer of the gateway, in one place: OpenAI's body (`{"error": {message, type, param, code}}`)
on every route and status: validation (400, not FastAPI's 422), unknown routes and methods, unparsable bodies,
gateway errors (429 with Retry-After), and bugs (500, the traceback in the log, never in the answer)."""

import math

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gateway.errors import GatewayError, Overloaded, openai_error_body

log = structlog.get_logger(__name__)


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(openai_error_body(status, message, param), status_code=status, headers=headers)


def gateway_error_response(e: GatewayError) -> JSONResponse:
    headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))} if isinstance(e, Overloaded) else None
    if e.http_status >= 500 and e.http_status not in (503, 504):
        log.error("upstream error", status=e.http_status, error=str(e))
    return error_response(e.http_status, str(e), e.param, headers)


def validation_message(e: RequestValidationError) -> tuple[str, str | None]:
    """The first error as a message, and the field it names (OpenAI's `param`)."""
    first = e.errors()[0] if e.errors() else {}
    loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    return f"invalid request body: {loc + ': ' if loc else ''}{first.get('msg', 'malformed')}", loc or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, e: GatewayError) -> JSONResponse:
        return gateway_error_response(e)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        message, param = validation_message(e)
        return error_response(400, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        """Starlette's own answers: 404 (no such route), 405 (wrong method), 400 (a body that is not JSON)."""
        message = str(e.detail) if e.status_code != 400 else f"invalid request body: {e.detail}"
        return error_response(e.status_code, message, headers=dict(e.headers or {}))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        log.error("unhandled error", path=request.url.path, exc_info=e)
        return error_response(500, "internal server error; the gateway's log has the details")
