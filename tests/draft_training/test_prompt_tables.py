"""The prompt tables read from draft_training/data/: they ship as package data, load as read-only tables, and
every slot they name has something to fill it. No model needed."""

import re
import string
import tomllib
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

import pytest

from draft_training import prompts, task_words
from draft_training.prompt_topics import instructions
from draft_training.task_words import task_tables

ROOT = Path(__file__).resolve().parents[2]


def _slots(text: str) -> set[str]:
    return {field.rstrip("0123456789") for _, field, _, _ in string.Formatter().parse(text) if field}


def test_every_data_file_ships_as_package_data():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = globs["draft_training"]
    files = [p.name for p in (resources.files("draft_training") / "data").iterdir() if p.name.endswith(".json")]
    assert "task_skeletons.json" in files and "instructions.json" in files
    assert all(any(fnmatch(f"data/{name}", glob) for glob in shipped) for name in files), (files, shipped)


def test_tables_are_read_only_and_well_formed():
    tables = task_tables()
    assert task_tables() is tables and task_words.TASKS is tables.tasks
    with pytest.raises(TypeError):
        tables.words["name"] = ("Nobody",)  # type: ignore[index]
    assert all(isinstance(v, tuple) and v for table in (tables.tasks, tables.records, tables.words)
               for v in table.values())
    assert all(low <= high for low, high in tables.numbers.values())
    assert all(len(a.items) >= 4 for a in tables.assignments)  # up to four people draw distinct items
    assert all(sum(bool(re.search(rf"\b{re.escape(w)}\b", s)) for w in tables.errors) >= 2
               for s in tables.clean_sentences)
    table = instructions()
    assert all("{topic}" in t for t in table.chat_templates) and all("{doc}" in t for t in table.docs_tasks)
    assert len(set(table.topics)) == len(table.topics)


def test_every_slot_has_a_source():
    tables = task_tables()
    sources = {*tables.numbers, *tables.records, *tables.words, *prompts._GENERATORS}
    texts = [*(s for skeletons in tables.tasks.values() for s in skeletons),
             *(r for records in tables.records.values() for r in records),
             *(w for words in tables.words.values() for w in words), *tables.clean_sentences]
    assert {slot for text in texts for slot in _slots(text)} <= sources
    with pytest.raises(AttributeError):
        task_words.NOT_A_TABLE  # noqa: B018
