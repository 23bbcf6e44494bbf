"""`ssd loadtest` on the gateway's streaming Generation API and the target's GetInfo: ghz keys plus TTFT
and inter-token latency for the stream, no errors."""

import asyncio
import json

import pytest

from loadtest.options import LoadOptions
from loadtest.report import build_report
from loadtest.runner import run_load
from tests.integration.conftest import API_KEY

pytestmark = pytest.mark.model


def test_generate_stream_reports_ttft_and_inter_token_latency(stack) -> None:  # noqa: ANN001
    data = {"chat": {"messages": [{"role": "user", "content": "Say hello."}]}, "max_tokens": 8,
            "mode": "SPECULATION_MODE_SD"}
    opts = LoadOptions(host=stack.grpc_address, call="ssd.v1.Generation.GenerateStream", data=json.dumps(data),
                       metadata=(("authorization", f"Bearer {API_KEY}"),), concurrency=2, total=4, is_insecure=True)
    report = build_report(asyncio.run(run_load(opts)), opts)
    assert report["statusCodeDistribution"] == {"OK": 4}, report["errorDistribution"]
    stream = report["streaming"]
    assert stream["ttft"]["count"] == 4
    assert 0 < stream["ttft"]["average"] <= report["average"]
    assert stream["interTokenLatency"]["count"] > 0


def test_target_get_info_without_errors(stack) -> None:  # noqa: ANN001
    opts = LoadOptions(host=stack.target_addresses[0], call="ssd.v1.Verifier.GetInfo", concurrency=4, total=40,
                       is_insecure=True)
    report = build_report(asyncio.run(run_load(opts)), opts)
    assert report["statusCodeDistribution"] == {"OK": 40}
    assert "streaming" not in report
