"""The status table of the two model services: engine errors (ssd.errors) -> gRPC codes.

Only typed errors are client errors. A builtin KeyError / ValueError / IndexError from inside the engine is a
bug there, not a bad request: it stays INTERNAL, logged with its traceback by the interceptor.
"""

import asyncio

import grpc

from ssd.errors import (
    CheckpointError,
    EngineDeadError,
    FetchError,
    InvalidRequestError,
    ModelNotFoundError,
    ResourceExhaustedError,
    UnknownSequenceError,
)

ENGINE_STATUS = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    UnknownSequenceError: grpc.StatusCode.NOT_FOUND,
    ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MemoryError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    CheckpointError: grpc.StatusCode.FAILED_PRECONDITION,
    FetchError: grpc.StatusCode.UNAVAILABLE,
    EngineDeadError: grpc.StatusCode.UNAVAILABLE,
    ConnectionError: grpc.StatusCode.UNAVAILABLE,
    TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    asyncio.CancelledError: grpc.StatusCode.CANCELLED,
}
