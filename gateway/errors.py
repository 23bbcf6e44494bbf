"""Gateway errors: each carries its gRPC status; the HTTP bridge maps statuses to HTTP codes once.

`openai_error_body` is the one shape of every HTTP error body (OpenAI's); `gateway.http_errors` sends it.
"""

import grpc

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

OPENAI_TYPES = {  # the `type` field of OpenAI error bodies
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
    415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
    503: "service_unavailable", 504: "timeout_error",
}


class GatewayError(Exception):
    grpc_status = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the offending request field, for OpenAI error bodies

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.grpc_status, 500)


class InvalidRequest(GatewayError):
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class Unauthenticated(GatewayError):
    grpc_status = grpc.StatusCode.UNAUTHENTICATED


class ModelNotFound(GatewayError):
    grpc_status = grpc.StatusCode.NOT_FOUND


class NoReplica(GatewayError):
    grpc_status = grpc.StatusCode.UNAVAILABLE


class Overloaded(GatewayError):
    """The admission queue is full, or the key is past its rate or concurrency limit: retry after a while."""

    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTooLarge(GatewayError):
    """A gRPC request past the configured message size (gRPC's own status for that; 413 on HTTP)."""

    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED

    @property
    def http_status(self) -> int:
        return 413


class DeadlineExceeded(GatewayError):
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class UpstreamError(GatewayError):
    """A target answered with an error status: passed on with the same status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_status = code


def openai_error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": OPENAI_TYPES.get(status, "server_error"), "param": param,
                      "code": status}}
