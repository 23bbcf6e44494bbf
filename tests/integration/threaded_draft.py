"""A draft service's gRPC server on an event loop in a thread of the test, for a target engine driven in-process."""

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from deploy.local import free_port
from draft_service.servicer import SpeculatorServicer
from protos.ssd.v1 import draft_pb2_grpc
from rpc.engine_errors import ENGINE_STATUS
from rpc.server import GrpcServer, HostedService


@contextmanager
def threaded_draft_server(draft, name: str) -> Iterator[str]:  # noqa: ANN001 - a ServiceProposer
    """Serve `draft` (draft_service.proposers.build_service_proposer's) on a free localhost port; yields the
    address, and stops the server and the servicer's worker after."""
    address = f"127.0.0.1:{free_port()}"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servicer = SpeculatorServicer(draft, name)

    async def start() -> GrpcServer:
        service = HostedService("ssd.v1.Speculator", servicer, draft_pb2_grpc.add_SpeculatorServicer_to_server)
        server = GrpcServer([service], address, ENGINE_STATUS, grace_s=0.5)
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield address
    finally:
        asyncio.run_coroutine_threadsafe(server.server.stop(0.5), loop).result(30)
        asyncio.run_coroutine_threadsafe(servicer.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
