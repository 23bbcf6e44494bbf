"""`python -m draft_service --draft ngram --address 127.0.0.1:50052`: run the draft service.

An EAGLE-3 head also needs its target: `--draft <head folder> --target-model <target>`.
"""

import asyncio
import threading

import structlog
import torch

from draft_service.config import DraftServiceConfig, parse_args
from draft_service.limits import SessionLimits
from draft_service.metrics import build_registry
from draft_service.proposers import ServiceDraft, build_service_proposer
from draft_service.servicer import SpeculatorServicer
from protos import require_current_stubs
from protos.ssd.v1 import draft_pb2_grpc
from rpc.engine_errors import ENGINE_STATUS
from rpc.heap import settle_heap
from rpc.logging import configure_service_logging
from rpc.metrics_http import check_metrics_port_free, start_metrics_server
from rpc.server import GrpcServer, HostedService, PortInUseError, check_port_free
from rpc.tls_files import TlsConfigError
from ssd.errors import SSDError

log = structlog.get_logger(__name__)


async def serve(config: DraftServiceConfig, draft: ServiceDraft) -> None:
    if draft.grammars is not None:  # structured output's tokenizer index, before the first grammar needs it
        threading.Thread(target=draft.grammars.warm_up, name="grammar-warm-up", daemon=True).start()
    servicer = SpeculatorServicer(draft, config.draft, session_limits(config, draft))
    service = HostedService("ssd.v1.Speculator", servicer, draft_pb2_grpc.add_SpeculatorServicer_to_server)
    server = GrpcServer([service], config.address, ENGINE_STATUS, grace_s=config.grace_s, tls=config.tls,
                        is_internal=True)
    metrics = start_metrics_server(build_registry(servicer), config.address, config.metrics_port)

    async def on_stop() -> None:
        if metrics is not None:
            metrics.stop()
        await servicer.close()

    await server.run(on_stop)


def session_limits(config: DraftServiceConfig, draft: ServiceDraft) -> SessionLimits:
    """The config's limits; a sequence's length defaults to the draft model's positions (n-gram: 1 Mi tokens)."""
    return SessionLimits(max_speculative_tokens=config.max_speculative_tokens,
                         max_sequences=config.max_session_sequences,
                         max_model_len=config.engine.max_model_len or draft.max_model_len or 1 << 20)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    configure_service_logging("draft", config.log_level, json=config.log_json)
    require_current_stubs()
    torch.set_num_threads(config.engine.num_threads)
    try:
        check_port_free(config.address)  # before loading the model
        check_metrics_port_free(config.address, config.metrics_port)
    except PortInUseError as e:
        log.error("cannot start the draft", address=config.address, error=str(e))
        raise SystemExit(2) from e
    try:
        draft = build_service_proposer(config)
    except SSDError as e:  # a bad --draft / --target-model: say so in one line, exit non-zero
        log.error("cannot load the draft", draft=config.draft, target_model=config.target_model, error=str(e))
        raise SystemExit(2) from e
    settle_heap()
    try:
        asyncio.run(serve(config, draft))
    except (PortInUseError, TlsConfigError) as e:  # one clear line, exit status 2 (a supervisor sees it)
        log.error("cannot start the draft", address=config.address, error=str(e))
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
