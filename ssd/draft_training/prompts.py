"""Training prompts built from sources reachable offline, never from the held-out benchmark sets.

Three sources, mixed deterministically by a seed:
- chat instructions: hand-written templates x topics (writing, role-play, reasoning, math, coding, STEM, humanities);
- Python standard-library functions: raw "complete this function" stubs (signature + docstring) and chat
  requests to explain, document or rewrite a snippet;
- documentation: module docstrings of installed packages, to summarize or explain.
"""

import ast
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ssd.draft_training.prompt_topics import CODE_TASKS, TEMPLATES, TOPICS


@dataclass(frozen=True)
class TrainingPrompt:
    source: str  # "chat" | "code-stub" | "code-chat" | "docs"
    text: str
    is_chat: bool  # True: a user message for the chat template; False: raw text to continue


def chat_prompts(rng: random.Random, num: int) -> list[TrainingPrompt]:
    """`num` distinct (template, topic) instructions."""
    pairs = [(t, topic) for t in TEMPLATES for topic in TOPICS]
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
        task = rng.choice(CODE_TASKS)
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
    asks = ("Summarize this documentation in plain words:\n\n{doc}",
            "Explain to a beginner what this module is for:\n\n{doc}",
            "What are the main points of the following text?\n\n{doc}")
    return [TrainingPrompt("docs", rng.choice(asks).format(doc=d), True) for d in docs[:num]]


def build_training_prompts(seed: int, num_chat: int, num_code_stubs: int, num_code_chat: int,
                           num_docs: int) -> list[TrainingPrompt]:
    """The whole training mix, shuffled; the same seed and counts give the same list."""
    rng = random.Random(seed)
    prompts = (chat_prompts(rng, num_chat) + code_prompts(rng, num_code_stubs, num_code_chat)
               + docs_prompts(rng, num_docs))
    rng.shuffle(prompts)
    return prompts
