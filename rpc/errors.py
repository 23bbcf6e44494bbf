"""One server interceptor that maps typed exceptions to gRPC status codes, once, at the edge.

Each service passes its table (exception class -> status code); the first class in the exception's
MRO that the table names wins, then the error's own `grpc_status`. Anything unmapped is INTERNAL and logged with its traceback.
"""

from collections.abc import Callable, Mapping
from typing import Any

import grpc
import structlog
from grpc import aio

log = structlog.get_logger(__name__)

StatusTable = Mapping[type[BaseException], grpc.StatusCode]


def status_for(error: BaseException, table: StatusTable) -> grpc.StatusCode:
    """The table's code for the error's class (nearest in the MRO), else the error's own `grpc_status`."""
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    own = getattr(error, "grpc_status", None)
    return own if isinstance(own, grpc.StatusCode) else grpc.StatusCode.INTERNAL


class ErrorMappingInterceptor(aio.ServerInterceptor):
    def __init__(self, table: StatusTable) -> None:
        self.table = dict(table)

    async def _abort(self, context: aio.ServicerContext, error: Exception, method: str) -> None:
        code = status_for(error, self.table)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("unhandled error", method=method)
        else:
            log.info("request failed", method=method, code=code.name, error=str(error))
        await context.abort(code, str(error) or type(error).__name__)

    def _wrap_unary(self, behavior: Callable, method: str) -> Callable:
        async def wrapped(request: Any, context: aio.ServicerContext) -> Any:
            try:
                return await behavior(request, context)
            except aio.AbortError:
                raise
            except Exception as e:  # mapped to a status, never swallowed
                await self._abort(context, e, method)

        return wrapped

    def _wrap_stream(self, behavior: Callable, method: str) -> Callable:
        async def wrapped(request: Any, context: aio.ServicerContext) -> Any:
            try:
                async for item in behavior(request, context):
                    yield item
            except aio.AbortError:
                raise
            except Exception as e:  # mapped to a status, never swallowed
                await self._abort(context, e, method)

        return wrapped

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._wrap_unary(handler.unary_unary, method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._wrap_stream(handler.unary_stream, method))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._wrap_stream(handler.stream_stream, method))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._wrap_unary(handler.stream_unary, method))
        return handler
