"""Training prompts built from sources reachable offline, never from the held-out benchmark sets.

Four sources, mixed deterministically by a seed:
- chat instructions: hand-written templates x topics (writing, role-play, reasoning, math, coding, STEM, humanities);
- Python standard-library functions: raw "complete this function" stubs (signature + docstring) and chat
  requests to explain, document or rewrite a snippet;
- documentation: module docstrings of installed packages, to summarize or explain;
- tasks: requests of the kinds open chat asks for (extraction, math, reasoning, role-play, constrained
  writing, editing, STEM, humanities), generated from skeletons and word lists (task_words.py).
The tables (templates, topics, skeletons, words) are data files in draft_training/data/; this module composes
the prompts from them.
"""

import ast
import itertools
import random
import re
import string
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draft_training.prompt_topics import instructions
from draft_training.task_words import task_tables
from ssd.errors import InvalidRequestError


@dataclass(frozen=True)
class TrainingPrompt:
    source: str  # "chat" | "code-stub" | "code-chat" | "docs" | "task"
    text: str
    is_chat: bool  # True: a user message for the chat template; False: raw text to continue


def chat_prompts(rng: random.Random, num: int) -> list[TrainingPrompt]:
    """`num` distinct (template, topic) instructions."""
    table = instructions()
    pairs = [(t, topic) for t in table.chat_templates for topic in table.topics]
    rng.shuffle(pairs)
    return [TrainingPrompt("chat", t.format(topic=topic), True) for t, topic in pairs[:num]]


@dataclass(frozen=True)
class _Function:
    source: str  # the whole def, as written
    stub: str  # signature + docstring, ready to be continued
    summary: str  # first docstring line


def _functions_in(path: Path, max_lines: int) -> list[_Function]:
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.col_offset != 0 or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or not node.body or node.end_lineno is None or node.end_lineno - node.lineno > max_lines:
            continue
        first_body = node.body[1] if len(node.body) > 1 else None
        if first_body is None:
            continue
        stub = "\n".join(lines[node.lineno - 1 : first_body.lineno - 1]) + "\n"
        source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        found.append(_Function(source, stub, doc.strip().splitlines()[0]))
    return found


def stdlib_functions(max_lines: int = 40) -> list[_Function]:
    """Top-level public functions with docstrings from the standard library's own .py files."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(folder.glob("*.py")):
        found.extend(_functions_in(path, max_lines))
    return found


def code_prompts(rng: random.Random, num_stubs: int, num_chat: int) -> list[TrainingPrompt]:
    funcs = stdlib_functions()
    rng.shuffle(funcs)
    stubs = [TrainingPrompt("code-stub", f.stub, False) for f in funcs[:num_stubs]]
    chats = []
    for f in funcs[num_stubs : num_stubs + num_chat]:
        task = rng.choice(instructions().code_tasks)
        chats.append(TrainingPrompt("code-chat", task.format(code=f.source, summary=f.summary), True))
    return stubs + chats


def docs_prompts(rng: random.Random, num: int, max_chars: int = 1200) -> list[TrainingPrompt]:
    """Module docstrings of installed packages (site-packages), to summarize or explain."""
    roots = {Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()}
    docs = []
    for root in sorted(roots):
        for path in sorted([*root.glob("*/*.py"), *root.glob("*/*/*.py")]):
            try:
                doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            if doc and 200 <= len(doc) <= max_chars:
                docs.append(doc)
    rng.shuffle(docs)
    asks = instructions().docs_tasks
    return [TrainingPrompt("docs", rng.choice(asks).format(doc=d), True) for d in docs[:num]]


# Draws before a slot settles for a repeated value, or a task kind for a repeated prompt.
MAX_DRAWS = 50

Used = dict[str, set[str]]  # slot base -> values already drawn for one prompt, so `name` and `name2` differ


def fill_slots(rng: random.Random, template: str, used: Used | None = None) -> str:
    """Fill every `{slot}` of `template`; a slot named twice keeps one value (see task_words.py)."""
    used = {} if used is None else used
    values: dict[str, str] = {}
    for _, field, _, _ in string.Formatter().parse(template):
        if field and field not in values:
            values[field] = _draw(rng, field.rstrip("0123456789"), used)
    return template.format(**values)


def _draw(rng: random.Random, base: str, used: Used) -> str:
    taken = used.setdefault(base, set())
    for _ in range(MAX_DRAWS):
        value = _draw_once(rng, base, used)
        if value not in taken:
            break
    taken.add(value)
    return value


def _draw_once(rng: random.Random, base: str, used: Used) -> str:
    tables = task_tables()
    if base in tables.numbers:
        return str(rng.randint(*tables.numbers[base]))
    if base in tables.records:
        return " ".join(fill_slots(rng, rng.choice(tables.records[base]), used) for _ in range(rng.randint(3, 4)))
    if base in _GENERATORS:
        return _GENERATORS[base](rng, used)
    return fill_slots(rng, rng.choice(tables.words[base]), used)


def _names(rng: random.Random, used: Used, num: int) -> list[str]:
    return [_draw(rng, "name", used) for _ in range(num)]


def _listed(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1]


def _order_puzzle(rng: random.Random, used: Used) -> str:
    """Facts about neighbors in a hidden order (one redundant at times), shuffled; the order is unique."""
    relation, question = rng.choice(task_tables().orderings)
    order = _names(rng, used, rng.randint(4, 5))
    pairs = [(order[i], order[i + 1]) for i in range(len(order) - 1)]
    if rng.random() < 0.5:
        pairs.append((order[0], order[2]))
    rng.shuffle(pairs)
    return " ".join(f"{a} {relation} {b}." for a, b in pairs) + " " + question


def _assignment_puzzle(rng: random.Random, used: Used) -> str:
    """People matched one-to-one with items; true "is not" clues are added until one matching is left."""
    intro, is_fact, is_not_fact, question, all_items = rng.choice(task_tables().assignments)
    num = rng.randint(3, 4)
    people, items = _names(rng, used, num), rng.sample(all_items, num)  # people[i] has items[i]
    facts = [(p, i) for p in range(num) for i in range(num) if p != i]
    rng.shuffle(facts)
    matchings = list(itertools.permutations(range(num)))
    clues = []
    while len(matchings) > 1:
        p, i = facts.pop()
        left = [m for m in matchings if m[p] != i]
        if len(left) < len(matchings):  # a clue that rules nothing out only makes the puzzle longer
            matchings = left
            clues.append(is_not_fact.format(who=people[p], what=items[i]))
    if rng.random() < 0.3:  # at times one clue states a match outright
        p = rng.randrange(num)
        clues.insert(rng.randrange(len(clues) + 1), is_fact.format(who=people[p], what=items[p]))
    shown = rng.sample(items, num)
    return " ".join([intro.format(people=_listed(people), items=_listed(shown)), *clues, question])


def _sequence(rng: random.Random, used: Used) -> str:
    """Five terms of an arithmetic, geometric, square-based, Fibonacci-like or interleaved sequence."""
    a, d, r = rng.randint(1, 20), rng.randint(2, 9), rng.randint(2, 3)
    rules = [[a + d * i for i in range(5)], [a * r**i for i in range(5)],
             [(i + a % 5) ** 2 + d for i in range(5)], [a, d, a + d, a + 2 * d, 2 * a + 3 * d],
             [a, 50 - d, a + d, 50 - 2 * d, a + 2 * d]]
    return ", ".join(map(str, rng.choice(rules))) + ", ..."


def _scores(rng: random.Random, used: Used) -> str:
    return _listed([str(rng.randint(55, 98)) for _ in range(rng.randint(3, 6))])


def _flawed(rng: random.Random, used: Used) -> str:
    """A clean sentence with two or three of its words swapped for common misspellings or grammar slips."""
    tables = task_tables()
    taken = used.setdefault("clean_sentence", set())  # two flawed sentences in one prompt: two templates
    template = rng.choice([t for t in tables.clean_sentences if t not in taken] or tables.clean_sentences)
    taken.add(template)
    sentence = fill_slots(rng, template, used)
    present = [w for w in tables.errors if re.search(rf"\b{re.escape(w)}\b", sentence)]
    for word in rng.sample(present, min(len(present), rng.randint(2, 3))):
        sentence = re.sub(rf"\b{re.escape(word)}\b", tables.errors[word], sentence, count=1)
    return sentence


_GENERATORS: dict[str, Callable[[random.Random, Used], str]] = {
    "order_puzzle": _order_puzzle, "assignment_puzzle": _assignment_puzzle, "sequence": _sequence,
    "scores": _scores, "flawed": _flawed,
}


def task_prompts(rng: random.Random, num: int) -> list[TrainingPrompt]:
    """`num` distinct generated requests; the kinds of the task tables take turns, a skeleton is drawn within a
    kind."""
    tasks = task_tables().tasks
    kinds = list(tasks)
    texts: list[str] = []  # in kind order; a set alone would lose the order across runs
    seen: set[str] = set()
    for i in range(num):
        for _ in range(MAX_DRAWS):
            text = fill_slots(rng, rng.choice(tasks[kinds[i % len(kinds)]]))
            if text not in seen:
                break
        else:
            raise InvalidRequestError(f"cannot make {num} distinct task prompts: {kinds[i % len(kinds)]} ran out")
        seen.add(text)
        texts.append(text)
    return [TrainingPrompt("task", text, True) for text in texts]


def build_training_prompts(seed: int, num_chat: int, num_code_stubs: int, num_code_chat: int,
                           num_docs: int, num_tasks: int = 0) -> list[TrainingPrompt]:
    """The whole training mix, shuffled; the same seed and counts give the same list (num_tasks=0: as before
    the task source existed)."""
    rng = random.Random(seed)
    prompts = (chat_prompts(rng, num_chat) + code_prompts(rng, num_code_stubs, num_code_chat)
               + docs_prompts(rng, num_docs) + task_prompts(rng, num_tasks))
    rng.shuffle(prompts)
    return prompts
