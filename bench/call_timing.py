"""Timing of small kernel calls in one process: the median of repeated calls, and several calls taking turns so a
noisy spell of the machine hits all of them alike; the command line and the JSON of such a bench."""

import argparse
import json
import time
from collections.abc import Callable

import torch


def parse_args(description: str, argv: list[str] | None, repeats: int) -> argparse.Namespace:
    """--threads (set for torch here), --repeats and --json, the options every kernel-call bench takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def write_rows(args: argparse.Namespace, rows: list[dict]) -> None:
    """The bench's rows to args.json (if given), with the thread count."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rows": rows}, f, indent=1)


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """The median of `repeats` timed calls, in milliseconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * sorted(times)[len(times) // 2]


def in_turns_ms(calls: dict[str, Callable[[], object]], repeats: int, rounds: int = 3) -> dict[str, float]:
    """Each call's best median over `rounds` rounds in which the calls take turns, in milliseconds."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            best[name] = min(best[name], median_ms(call, repeats))
    return best
