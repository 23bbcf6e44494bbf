"""`ssd loadtest` against the real draft service (n-gram draft: no weights): ghz-shaped reports,
rate holding, and UNAVAILABLE results (not a crash) against a closed port."""

import argparse
import asyncio
import json

import pytest

from deploy.local import Child, free_port, spawn, stop_child, wait_healthy
from loadtest.cli import add_loadtest_arguments
from loadtest.options import LoadOptions
from loadtest.report import build_report
from loadtest.runner import run_load

GHZ_KEYS = {"date", "endReason", "options", "count", "total", "average", "fastest", "slowest", "rps",
            "errorDistribution", "statusCodeDistribution", "latencyDistribution", "histogram", "details"}


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Child:
    address = f"127.0.0.1:{free_port()}"
    child = spawn("draft", ["draft_service", "--draft", "ngram", "--address", address, "--threads", "1"],
                  address, None, tmp_path_factory.mktemp("loadtest-logs"))
    try:
        wait_healthy([child], timeout_s=60)
        yield child
    finally:
        stop_child(child)


def _run_cli(argv: list[str], capsys) -> dict:  # noqa: ANN001
    parser = argparse.ArgumentParser()
    add_loadtest_arguments(parser)
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_duration_run_has_no_errors_and_ghz_keys(draft: Child, capsys) -> None:  # noqa: ANN001
    report = _run_cli([draft.address, "--insecure", "--call", "ssd.v1.Speculator.GetInfo", "-c", "4", "-z", "3s",
                       "-O", "json"], capsys)
    assert GHZ_KEYS <= report.keys()
    assert report["count"] > 10
    assert report["statusCodeDistribution"] == {"OK": report["count"]}
    assert report["errorDistribution"] == {}
    assert [d["percentage"] for d in report["latencyDistribution"]] == [10, 25, 50, 75, 90, 95, 99]
    assert 0 < report["fastest"] <= report["average"] <= report["slowest"]  # nanoseconds, as ghz
    assert 2.9e9 < report["total"] < 5e9
    assert report["endReason"] == "timeout"


def test_rps_holds_the_rate(draft: Child) -> None:
    opts = LoadOptions(host=draft.address, call="ssd.v1.Speculator.GetInfo", concurrency=4, duration_s=3.0,
                       rps=20, is_insecure=True)
    report = build_report(asyncio.run(run_load(opts)), opts)
    assert report["statusCodeDistribution"] == {"OK": report["count"]}
    assert report["rps"] == pytest.approx(20, rel=0.10)
    assert report["count"] == pytest.approx(60, abs=3)


def test_closed_port_reports_unavailable(capsys) -> None:  # noqa: ANN001
    report = _run_cli([f"127.0.0.1:{free_port()}", "--insecure", "--call", "ssd.v1.Verifier.GetInfo",
                       "-n", "10", "-c", "2", "-O", "json"], capsys)
    assert report["count"] == 10
    assert report["statusCodeDistribution"] == {"Unavailable": 10}
    assert sum(report["errorDistribution"].values()) == 10
    assert all(e.startswith("rpc error: code = Unavailable") for e in report["errorDistribution"])
    assert report["latencyDistribution"] == []


def test_unknown_method_is_a_clear_error(draft: Child, capsys) -> None:  # noqa: ANN001
    parser = argparse.ArgumentParser()
    add_loadtest_arguments(parser)
    args = parser.parse_args([draft.address, "--insecure", "--call", "ssd.v1.Speculator.Nope"])
    assert args.func(args) == 2
    assert "has no method Nope" in capsys.readouterr().err


def test_summary_text_has_ghz_sections(capsys) -> None:  # noqa: ANN001
    parser = argparse.ArgumentParser()
    add_loadtest_arguments(parser)
    args = parser.parse_args([f"127.0.0.1:{free_port()}", "--insecure", "--call", "ssd.v1.Verifier/GetInfo",
                              "-n", "3", "-c", "1"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    for section in ("Summary:", "Count:\t3", "Requests/sec:", "Status code distribution:", "[Unavailable]\t3",
                    "Error distribution:"):
        assert section in text
