"""The hand-written instruction tables of the chat, code-chat and docs training prompts, read on first use from
draft_training/data/instructions.json (data/README.md describes the files)."""

from dataclasses import dataclass
from functools import cache

from draft_training.package_data import read_json


@dataclass(frozen=True)
class Instructions:
    chat_templates: tuple[str, ...]  # each holds `{topic}`; every template x topic pair is one chat prompt
    topics: tuple[str, ...]
    code_tasks: tuple[str, ...]  # each holds a standard-library function's `{code}` or its `{summary}`
    docs_tasks: tuple[str, ...]  # each holds `{doc}`, a module docstring of an installed package


@cache
def instructions() -> Instructions:
    table = read_json("instructions.json")
    return Instructions(chat_templates=tuple(table["chat_templates"]), topics=tuple(table["topics"]),
                        code_tasks=tuple(table["code_tasks"]), docs_tasks=tuple(table["docs_tasks"]))
