"""The tables of the generated "task" training prompts, read on first use from draft_training/data/task_*.json
(data/README.md describes the files): request skeletons per kind, and the tables their slots are filled from.

A skeleton's `{slot}` is filled from words (an entry may hold slots itself), numbers (an inclusive range),
records (3-4 filled record sentences, a passage to extract from) or a generator in prompts.py. A digit
suffix (`{name2}`) draws another, distinct value of the same slot. All text is hand-written; none is taken
from the held-out MT-Bench or HumanEval sets.
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from types import MappingProxyType
from typing import Any, NamedTuple

from draft_training.package_data import read_json


class Ordering(NamedTuple):
    """The ordering puzzle: adjacent facts of a hidden order ("A <relation> B.") stated in random order."""

    relation: str
    question: str


class Assignment(NamedTuple):
    """The assignment puzzle: people matched one-to-one with items; clues are added until one answer fits."""

    intro: str  # holds {people} and {items}
    is_fact: str  # holds {who} and {what}
    is_not_fact: str  # holds {who} and {what}
    question: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class TaskTables:
    tasks: Mapping[str, tuple[str, ...]]  # kind -> request skeletons; the kinds take turns
    numbers: Mapping[str, tuple[int, int]]  # number slot -> inclusive range
    records: Mapping[str, tuple[str, ...]]  # record slot ({people}, ...) -> record sentences
    words: Mapping[str, tuple[str, ...]]  # word slot -> entries
    orderings: tuple[Ordering, ...]
    assignments: tuple[Assignment, ...]
    errors: Mapping[str, str]  # correct word -> the misspelling or grammar slip planted in its place
    clean_sentences: tuple[str, ...]  # sentences to plant errors in (each holds several of their words)


@cache
def task_tables() -> TaskTables:
    slots, puzzles, errors = read_json("task_slots.json"), read_json("task_puzzles.json"), read_json("task_errors.json")
    return TaskTables(
        tasks=_tuples(read_json("task_skeletons.json")),
        numbers=MappingProxyType({slot: (low, high) for slot, (low, high) in slots["numbers"].items()}),
        records=_tuples(slots["records"]),
        words=_tuples(slots["words"]),
        orderings=tuple(Ordering(**ordering) for ordering in puzzles["orderings"]),
        assignments=tuple(Assignment(**{**a, "items": tuple(a["items"])}) for a in puzzles["assignments"]),
        errors=MappingProxyType(errors["errors"]),
        clean_sentences=tuple(errors["clean_sentences"]),
    )


def _tuples(table: dict[str, list[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({key: tuple(values) for key, values in table.items()})


_FIELDS = {field.name for field in fields(TaskTables)}


def __getattr__(name: str) -> Any:
    """The tables also read as constants, `TASKS` for `tasks` and so on, loaded on first use like the rest."""
    if name.isupper() and name.lower() in _FIELDS:
        return getattr(task_tables(), name.lower())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
