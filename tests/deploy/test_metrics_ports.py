"""`ssd serve --metrics-port P`: the draft's /metrics on P, target i's on P + 1 + i (0: free ports); the banner
lists every service's /metrics; the model services' own flag and its range check."""

import argparse

import pytest

from deploy.cli import add_serve_command, banner, stack_config
from deploy.local import Stack, start_draft, start_target
from draft_service.config import parse_args as parse_draft_args
from ssd.errors import InvalidRequestError
from target_service.config import TargetServiceConfig
from target_service.config import parse_args as parse_target_args


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_fixed_ports_follow_the_base_and_zero_picks_free_ones(monkeypatch) -> None:
    started = []
    monkeypatch.setattr("deploy.local.spawn", lambda name, args, *_, **__: started.append(args) or _child(name))
    config = stack_config(serve_args("--metrics-port", "9400", "--draft", "ngram"))
    stack = Stack(config)
    start_draft(stack, None)
    start_target(stack, 0, None)
    start_target(stack, 1, None)
    ports = [int(args[args.index("--metrics-port") + 1]) for args in started]
    assert ports == [9400, 9401, 9402]
    assert [c.metrics_url for c in stack.children] == [f"http://127.0.0.1:{p}/metrics" for p in ports]
    started.clear()
    free = Stack(stack_config(serve_args("--draft", "ngram")))
    start_draft(free, None)
    start_target(free, 0, None)
    free_ports = [int(args[args.index("--metrics-port") + 1]) for args in started]
    assert all(p > 0 for p in free_ports) and len(set(free_ports)) == 2


def _child(name: str):  # noqa: ANN202 - a stand-in for deploy.local.Child
    from deploy.local import Child

    return Child(name, proc=None, address="127.0.0.1:1")


def test_the_banner_lists_the_metrics_urls() -> None:
    urls = ["http://127.0.0.1:9400/metrics", "http://127.0.0.1:8000/metrics"]
    text = banner("http://127.0.0.1:8000", "127.0.0.1:50050", "m", None, urls)
    assert "Prometheus /metrics: " + "  ".join(urls) in text
    assert "Prometheus" not in banner("http://127.0.0.1:8000", "127.0.0.1:50050", "m", None)


def test_the_services_flag_defaults_off_and_reads_the_environment(monkeypatch) -> None:
    assert parse_target_args([]).metrics_port == 0 and parse_draft_args([]).metrics_port == 0
    monkeypatch.setenv("SSD_TARGET_METRICS_PORT", "9400")
    monkeypatch.setenv("SSD_DRAFT_METRICS_PORT", "9401")
    assert parse_target_args([]).metrics_port == 9400 and parse_draft_args([]).metrics_port == 9401
    assert parse_target_args(["--metrics-port", "9500"]).metrics_port == 9500
    with pytest.raises(InvalidRequestError):
        TargetServiceConfig(metrics_port=70000)
