"""`python -m target_service --model smollm2-135m-instruct --draft-address 127.0.0.1:50052`."""

import asyncio
import dataclasses
import threading

import structlog
import torch

from protos import require_current_stubs
from protos.ssd.v1 import target_pb2_grpc
from rpc.engine_errors import ENGINE_STATUS
from rpc.heap import settle_heap
from rpc.logging import configure_service_logging
from rpc.metrics_http import check_metrics_port_free, start_metrics_server
from rpc.server import GrpcServer, HostedService, PortInUseError, check_port_free
from rpc.tls_files import TlsConfigError
from ssd.config import DecodeMode
from ssd.dtypes import cpu_has_fast_bfloat16
from ssd.engine.llm_engine import LLMEngine
from ssd.errors import SSDError
from ssd.model_config import load_model_config
from ssd.model_store import ensure_model, resolve_model
from target_service.admission import AdmissionLimits
from target_service.config import TargetServiceConfig, parse_args
from target_service.engine_loop import EngineLoop
from target_service.metrics import build_registry
from target_service.remote_proposer import RemoteProposer, fetch_feature_layers
from target_service.servicer import VerifierServicer

log = structlog.get_logger(__name__)


def build_engine(config: TargetServiceConfig) -> tuple[LLMEngine, RemoteProposer | None]:
    engine_config = config.engine
    ensure_model(engine_config.model)  # a known model not cached yet is pulled first (unless SSD_OFFLINE=1)
    if not config.draft_addresses:
        return LLMEngine(engine_config), None
    vocab_size = load_model_config(resolve_model(engine_config.model)).vocab_size
    feature_layers = config.draft_feature_layers  # the engine computes them from the prompt on: known now
    if feature_layers is None:
        feature_layers = fetch_feature_layers(list(config.draft_addresses), config.draft_info_timeout_s, config.tls)
    proposer = RemoteProposer(list(config.draft_addresses), config.replica_id, vocab_size, config.draft_timeout_s,
                              config.reconnect_interval_s, feature_layers,
                              offer_shared_memory=config.tensor_transport == "auto",
                              device=torch.device(engine_config.device), tls=config.tls)
    engine = LLMEngine(dataclasses.replace(engine_config, speculation=config.speculation), proposer=proposer)
    if engine_config.device == "cpu" and config.default_mode is not DecodeMode.AR and not cpu_has_fast_bfloat16():
        log.warning("this CPU has no native bfloat16 matmuls: verifying K+1 positions costs ~2x a decode step "
                    "here, and speculation measured slower than plain decoding (README, 'Speculation depends on "
                    "the CPU'); consider --default-mode ar", default_mode=config.default_mode)
    return engine, proposer


async def serve(config: TargetServiceConfig) -> None:
    check_port_free(config.address)  # before loading the model
    check_metrics_port_free(config.address, config.metrics_port)
    engine, proposer = build_engine(config)
    settle_heap()
    if engine.grammars is not None:  # structured output's tokenizer index, off the engine thread
        threading.Thread(target=engine.grammars.warm_up, name="grammar-warm-up", daemon=True).start()
    dead = asyncio.Event()
    admission = AdmissionLimits(config.engine.max_num_seqs + config.max_waiting_seqs, config.max_queued_tokens)
    engine_loop = EngineLoop(engine, asyncio.get_running_loop(), on_dead=dead.set, admission=admission)
    servicer = VerifierServicer(config, engine_loop, proposer)
    service = HostedService("ssd.v1.Verifier", servicer, target_pb2_grpc.add_VerifierServicer_to_server)
    server = GrpcServer([service], config.address, ENGINE_STATUS, grace_s=config.grace_s, tls=config.tls,
                        is_internal=True)

    async def stop_when_dead() -> None:
        await dead.wait()
        server.request_stop()

    metrics = start_metrics_server(build_registry(engine_loop, config.engine.model, config.speculation.num_speculative_tokens,
                                                  lambda: proposer is not None and proposer.is_connected),
                                   config.address, config.metrics_port)
    watcher = asyncio.create_task(stop_when_dead())
    engine_loop.start()

    async def on_stop() -> None:
        if metrics is not None:
            metrics.stop()
        engine_loop.stop()
        if proposer is not None:
            proposer.close()
        engine.close()

    await server.run(on_stop)
    watcher.cancel()
    if dead.is_set():
        raise SystemExit(1)  # an orchestrator restarts the service


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    configure_service_logging(config.replica_id, config.log_level, json=config.log_json)
    require_current_stubs()
    try:
        asyncio.run(serve(config))
    except (PortInUseError, TlsConfigError, SSDError) as e:  # one clear line, exit status 2 (a supervisor sees it)
        log.error("cannot start the target", address=config.address, model=config.engine.model, error=str(e))
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
