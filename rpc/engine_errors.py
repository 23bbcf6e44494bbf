"""The status table of the two model services: engine errors (ssd.errors) -> gRPC codes."""

import asyncio

import grpc

from ssd.errors import (
    CheckpointError,
    EngineDeadError,
    FetchError,
    InvalidRequestError,
    ModelNotFoundError,
    ResourceExhaustedError,
)

ENGINE_STATUS = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ValueError: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    KeyError: grpc.StatusCode.NOT_FOUND,
    ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MemoryError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    CheckpointError: grpc.StatusCode.FAILED_PRECONDITION,
    FetchError: grpc.StatusCode.UNAVAILABLE,
    EngineDeadError: grpc.StatusCode.UNAVAILABLE,
    ConnectionError: grpc.StatusCode.UNAVAILABLE,
    TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    asyncio.CancelledError: grpc.StatusCode.CANCELLED,
}
