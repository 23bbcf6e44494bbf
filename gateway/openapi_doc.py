"""The gateway's OpenAPI document as the server really answers: OpenAI error bodies (not FastAPI's 422 shape)
for every error status a route can give, streams as text/event-stream, /metrics as Prometheus text.

FastAPI derives the request bodies from the pydantic models; this adds what it cannot see (the guard's 401,
408 and 413, admission's 429 with Retry-After, the generation errors), so every answer is documented.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "code": {"type": "integer"}}}},
}
# one server-sent event: `data` is a JSON chunk (or an error body), the last one the text [DONE]
SSE_EVENT_SCHEMA = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
REASONS = {400: "Invalid request", 401: "Missing or invalid API key", 404: "No such model", 408: "Body too slow",
           413: "Body too large", 429: "Busy or past a rate limit: retry after Retry-After seconds",
           500: "Internal error", 503: "No target replica available", 504: "Past the request's timeout"}
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
GUARDED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


def _error(status: int) -> dict[str, Any]:
    out: dict[str, Any] = {"description": REASONS[status],
                           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    if status == 429:
        out["headers"] = {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}
    return out


def error_statuses(path: str, method: str) -> list[int]:
    """The error statuses a route answers with."""
    statuses = [500]
    if path.startswith(GUARDED_PREFIXES):
        statuses += [401, 408, 413]
    if method == "post":
        statuses += [400, 404, 429]
    if path in GENERATION_PATHS or path in ("/tokenize", "/detokenize"):
        statuses += [503, 504] if path in GENERATION_PATHS else [503]
    if path == "/health":
        statuses += [503]
    return sorted(set(statuses))


def document(schema: dict[str, Any]) -> dict[str, Any]:
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = ERROR_SCHEMA
    for path, item in schema["paths"].items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status in error_statuses(path, method):
                responses[str(status)] = _error(status)
            ok = responses.setdefault("200", {"description": "OK"})
            if path in GENERATION_PATHS:  # `stream: true` answers server-sent events
                ok.setdefault("content", {})["text/event-stream"] = {"schema": SSE_EVENT_SCHEMA}
            if path == "/metrics":
                ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
            if path == "/health":
                responses["503"]["content"] = ok.get("content", {})  # the same body, "unavailable"
    return schema


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
