"""Writes the two small lm-evaluation-harness tasks that exercise the HTTP bridge offline (no dataset hub):
arithmetic questions as multiple choice (log-likelihood requests: `echo` + `logprobs`) and as free answers
(`generate_until` requests: `stop`). Deterministic; run from anywhere: `python bench/lm_eval/make_tasks.py`."""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def _question(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    op = rng.choice(["+", "-", "*"]) if a < 13 and b < 13 else rng.choice(["+", "-"])
    return f"What is {a} {op} {b}?", {"+": a + b, "-": a - b, "*": a * b}[op]


def main() -> None:
    rng = random.Random(0)
    with (HERE / "arith_mc.jsonl").open("w") as f:
        for _ in range(40):
            question, answer = _question(rng)
            wrong = sorted({answer + d for d in rng.sample([-10, -2, -1, 1, 2, 10], 3)})
            choices = [str(c) for c in sorted([answer, *wrong])]
            f.write(json.dumps({"question": question, "choices": choices, "label": choices.index(str(answer))}) + "\n")
    with (HERE / "arith_gen.jsonl").open("w") as f:
        for _ in range(20):
            question, answer = _question(rng)
            f.write(json.dumps({"question": question, "answer": str(answer)}) + "\n")


if __name__ == "__main__":
    main()
