"""A model service's /metrics server: serves its registry over HTTP, says so in one error when the port is taken."""

import socket

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from rpc.metrics_http import check_metrics_port_free, host_of, start_metrics_server
from rpc.server import PortInUseError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serves_the_registry_until_stopped() -> None:
    registry = CollectorRegistry()
    Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ["model_name"], registry=registry
            ).labels("m").inc(3)
    port = _free_port()
    server = start_metrics_server(registry, "127.0.0.1:1", port)
    assert server is not None
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        sample = next(s for s in families["vllm:prompt_tokens"].samples if s.name.endswith("_total"))
        assert sample.labels == {"model_name": "m"} and sample.value == 3
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_port_zero_is_off_and_a_taken_port_is_one_error() -> None:
    assert start_metrics_server(CollectorRegistry(), "127.0.0.1:1", 0) is None
    check_metrics_port_free("127.0.0.1:1", 0)  # off: nothing to check
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PortInUseError):
            check_metrics_port_free("127.0.0.1:50051", port)
        with pytest.raises(PortInUseError):
            start_metrics_server(CollectorRegistry(), "127.0.0.1:50051", port)


def test_host_of_an_address() -> None:
    assert host_of("0.0.0.0:50051") == "0.0.0.0"
    assert host_of("[::]:50051") == "::"
