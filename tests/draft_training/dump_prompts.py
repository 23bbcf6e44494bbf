"""Dump every training prompt the generators make for fixed seeds and counts, to prove a change to the prompt
tables (draft_training/data/) or their code left the prompts bit-identical: run it before and after, compare.

    python tests/draft_training/dump_prompts.py OUT.txt   # prints the dump's sha256

Not a test (pytest does not collect it): the code source scans this machine's standard library, so the dump is
only comparable on one machine. The docs source reads a made-up site-packages folder instead of the real one,
which changes whenever a package is installed.
"""

import hashlib
import random
import sys
import tempfile
from pathlib import Path

from draft_training.prompts import (
    TrainingPrompt,
    build_training_prompts,
    chat_prompts,
    code_prompts,
    docs_prompts,
    fill_slots,
    task_prompts,
)
from draft_training.task_words import TASKS

# (seed, num_chat, num_code_stubs, num_code_chat, num_docs, num_tasks): the `ssd train-draft` defaults, the
# shipped head's command (drafts/smollm2-135m-eagle3/MODEL_CARD.md), and the mix before tasks existed.
MIXES = ((0, 400, 176, 208, 80, 320), (0, 800, 264, 312, 120, 640), (1, 400, 176, 208, 80, 320),
         (7, 20, 3, 3, 4, 0))


_FILLER = ("module", "returns", "the", "value", "of", "a", "parser", "for", "files", "and", "options", "when",
           "given", "data", "this", "helper", "reads", "writes", "each", "record", "into", "tables")


def _fake_site_packages(root: Path) -> Path:
    """A site-packages folder of packages whose module docstrings are made-up text, some too short or long."""
    rng = random.Random(0)
    site = root / "site-packages"
    for i in range(240):
        folder = site / f"pkg{i:03d}" / ("sub" if i % 3 == 0 else "")
        folder.mkdir(parents=True, exist_ok=True)
        doc = " ".join(rng.choice(_FILLER) for _ in range(rng.randint(20, 260)))
        (folder / f"mod{i}.py").write_text(f'"""{doc}"""\n', encoding="utf-8")
    return site


def _lines(title: str, prompts: list[TrainingPrompt]) -> list[str]:
    return [f"## {title}: {len(prompts)}"] + [f"{p.source} {p.is_chat} {p.text!r}" for p in prompts]


def dump() -> str:
    lines: list[str] = []
    for mix in MIXES:
        lines += _lines(f"build_training_prompts{mix}", build_training_prompts(*mix))
    for seed in (0, 3):
        lines += _lines(f"chat_prompts seed {seed}, all", chat_prompts(random.Random(seed), 10**6))
        lines += _lines(f"task_prompts seed {seed}", task_prompts(random.Random(seed), 3000))
        lines += _lines(f"code_prompts seed {seed}", code_prompts(random.Random(seed), 200, 10**6))
        lines += _lines(f"docs_prompts seed {seed}", docs_prompts(random.Random(seed), 10**6))
    rng = random.Random(11)
    for kind, skeletons in TASKS.items():
        for i, skeleton in enumerate(skeletons):
            lines.append(f"## fill_slots {kind} {i}")
            lines += [repr(fill_slots(rng, skeleton)) for _ in range(20)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.path[:] = [p for p in sys.path if not p.endswith("site-packages")] + [str(_fake_site_packages(Path(tmp)))]
        text = dump()
    Path(sys.argv[1]).write_text(text, encoding="utf-8")
    print(hashlib.sha256(text.encode()).hexdigest(), len(text.splitlines()), "lines")
