"""`ssd bench --interleave`: the modes of a batch size take turns group by group and give what they give alone."""

from dataclasses import replace

import pytest

from bench.datasets import load_prompts
from bench.runner import BenchSettings, _run_in_turn, run_benchmarks
from bench.timing import GroupTiming

SETTINGS = BenchSettings(mode="ar", model="unused", dataset="mtbench", output_len=2, batch=2, temperature=0.0,
                         dtype="float32", threads=1, warmup=1)


def _recording_runner(name: str, calls: list[tuple[str, int]]):  # noqa: ANN202 - a bench Runner
    def run(group: list[list[int]]) -> GroupTiming:
        calls.append((name, group[0][0]))
        return GroupTiming([[*prompt, 7] for prompt in group], 0.001, 0.002)

    return run


def test_runs_take_turns_group_by_group_after_their_warm_ups() -> None:
    calls: list[tuple[str, int]] = []
    encoded = [[i] for i in range(5)]  # groups of 2: [0, 1], [2, 3], [4]
    runs = [(SETTINGS, _recording_runner("a", calls), None),
            (replace(SETTINGS, mode="sd"), _recording_runner("b", calls), None)]
    results = _run_in_turn(runs, encoded)
    assert calls == [("a", 0), ("b", 0), ("a", 0), ("b", 0), ("a", 2), ("b", 2), ("a", 4), ("b", 4)]
    assert [r["mode"] for r in results] == ["ar", "sd"]
    for r in results:
        assert r["_outputs"] == [[i, 7] for i in range(5)]
        assert r["output_tokens"] == 10 and r["decode_tok_s"] > 0


@pytest.mark.model
def test_interleaved_modes_give_the_tokens_they_give_one_after_another() -> None:
    prompts = load_prompts("mtbench", 3)
    base = BenchSettings(mode="ar", model="smollm2-135m-instruct", dataset="mtbench", output_len=6, batch=2,
                         temperature=0.0, dtype="float32", threads=1, warmup=0)
    alone = run_benchmarks(base, ["ar", "sd"], [2], prompts)
    together = run_benchmarks(base, ["ar", "sd"], [2], prompts, interleave=True)
    assert [r["mode"] for r in together] == ["ar", "sd"] and all(r["interleaved"] for r in together)
    hashes = {r["outputs_sha256"] for r in alone + together}
    assert len(hashes) == 1  # float32 greedy: SD gives AR's tokens, interleaved or not
    assert together[1]["tokens_per_round"] is not None
