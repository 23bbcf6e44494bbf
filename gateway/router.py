"""Routing across target replicas: healthy only, least outstanding tokens, prefix affinity.

A background task polls each replica's grpc.health.v1 status and GetLoad. A request prefers the
replica its prompt prefix hashes to (rendezvous hashing: that replica's prefix cache likely holds
it) unless that replica is busier than the least-loaded one by more than `affinity_slack` tokens.
"""

import asyncio
import hashlib
from dataclasses import dataclass, field

import grpc
import structlog
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.errors import NoReplica
from protos.ssd.v1 import common_pb2, target_pb2, target_pb2_grpc
from rpc.options import CHANNEL_OPTIONS
from rpc.tls import aio_channel
from rpc.tls_files import TlsFiles

log = structlog.get_logger(__name__)

AFFINITY_PREFIX_TOKENS = 256  # the prompt prefix that picks the preferred replica (past any shared system prompt)


@dataclass
class Replica:
    address: str
    channel: aio.Channel
    stub: target_pb2_grpc.VerifierStub
    health: health_pb2_grpc.HealthStub
    is_healthy: bool = False
    num_outstanding_tokens: int = 0  # this gateway's in-flight tokens on it (max_tokens not yet streamed)
    load: common_pb2.Load = field(default_factory=common_pb2.Load)  # as last reported
    info: target_pb2.TargetInfo | None = None


class Router:
    def __init__(self, addresses: tuple[str, ...], interval_s: float = 0.5, affinity_slack: int = 256,
                 tls: TlsFiles | None = None) -> None:
        self.replicas = []
        for address in addresses:
            channel = aio_channel(address, tls, CHANNEL_OPTIONS)  # TLS when `tls` has a CA
            self.replicas.append(Replica(address, channel, target_pb2_grpc.VerifierStub(channel),
                                         health_pb2_grpc.HealthStub(channel)))
        self.interval_s = interval_s
        self.affinity_slack = affinity_slack
        self._task: asyncio.Task | None = None
        self.has_checked = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for r in self.replicas:
            await r.channel.close()

    async def _check(self, r: Replica) -> None:
        try:
            status = await r.health.Check(health_pb2.HealthCheckRequest(service="ssd.v1.Verifier"), timeout=2.0)
            healthy = status.status == health_pb2.HealthCheckResponse.SERVING
            if healthy:
                r.load = await r.stub.GetLoad(common_pb2.LoadRequest(), timeout=2.0)
                if r.info is None:
                    r.info = await r.stub.GetInfo(target_pb2.TargetInfoRequest(), timeout=10.0)
        except grpc.RpcError:
            healthy = False
        if healthy != r.is_healthy:
            log.info("replica health changed", replica=r.address, healthy=healthy)
        r.is_healthy = healthy

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(r) for r in self.replicas))

    async def _poll_forever(self) -> None:
        while True:
            await self.check_all()
            self.has_checked.set()
            is_discovering = any(r.info is None for r in self.replicas)  # poll fast until every replica was seen
            await asyncio.sleep(min(self.interval_s, 0.2) if is_discovering else self.interval_s)

    def mark_down(self, replica: Replica) -> None:
        if replica.is_healthy:
            log.warning("replica marked down", replica=replica.address)
        replica.is_healthy = False

    def info(self) -> target_pb2.TargetInfo | None:
        return next((r.info for r in self.replicas if r.info is not None), None)

    async def pick(self, prompt_token_ids: list[int], exclude: set[str] = frozenset()) -> Replica:
        healthy = [r for r in self.replicas if r.is_healthy and r.address not in exclude]
        if not healthy:  # the last poll may be stale (a slow health answer under load): look again now
            await self.check_all()
            healthy = [r for r in self.replicas if r.is_healthy and r.address not in exclude]
        if not healthy:
            raise NoReplica("no healthy target replica is available; retry shortly")
        key = ",".join(map(str, prompt_token_ids[:AFFINITY_PREFIX_TOKENS])).encode()
        preferred = max(healthy, key=lambda r: hashlib.blake2b(key + r.address.encode(), digest_size=8).digest())
        least = min(healthy, key=lambda r: r.num_outstanding_tokens)
        if preferred.num_outstanding_tokens - least.num_outstanding_tokens > self.affinity_slack:
            return least
        return preferred
