"""Several drafts per target: `ssd serve --drafts N` and the target's repeatable --draft-address."""

import argparse

import pytest

from deploy.cli import add_serve_command, stack_config
from deploy.local import draft_name
from target_service.config import parse_args as parse_target_args


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_takes_a_number_of_drafts():
    assert stack_config(serve_args()).num_drafts == 1
    assert stack_config(serve_args("--drafts", "2")).num_drafts == 2
    with pytest.raises(SystemExit):
        serve_args("--drafts", "0")


def test_the_first_draft_keeps_its_name():
    assert [draft_name(i) for i in range(3)] == ["draft", "draft-1", "draft-2"]


def test_the_target_takes_several_draft_addresses(monkeypatch):
    monkeypatch.delenv("SSD_DRAFT_ADDRESS", raising=False)
    assert parse_target_args([]).draft_addresses == () and parse_target_args([]).draft_address is None
    config = parse_target_args(["--draft-address", "a:1", "--draft-address", "b:2", "--draft-address", "a:1"])
    assert config.draft_addresses == ("a:1", "b:2")  # a repeated address is one draft
    assert config.draft_address == "a:1"
    monkeypatch.setenv("SSD_DRAFT_ADDRESS", "c:3, d:4")
    assert parse_target_args([]).draft_addresses == ("c:3", "d:4")
    assert parse_target_args(["--draft-address", "e:5"]).draft_addresses == ("e:5",)  # flags win over the variable
