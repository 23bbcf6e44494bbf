"""Are plain decode steps slower once the engine has speculated? One process, bf16, one thread, in-process draft.

    python -m bench.plain_after_rounds [--draft drafts/smollm2-135m-draft4] [--batch 1] [--tokens 256]
        [--every 32] [--rounds 4] [--repeats 3] [--target-core 0]

Mode auto at batch 1 interleaves a few speculative rounds (a probe) with many plain steps. This times the plain steps
themselves (the engine's own step timing, as the mode chooser receives it) under two scripted choosers, interleaved:
one that only ever takes plain steps, and one that takes `rounds` speculative rounds every `every` steps, as a probe
does. Its plain steps are also split by how soon after a round they came (1st-4th step after it, or later), and
the time Python's garbage collector took during each case's run is summed.
"""

import argparse
import gc
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Collection

import torch

from bench.datasets import load_prompts
from bench.runner import render_prompts
from ssd.config import ProposerChoice, SpeculationConfig
from ssd.engine.mode_choice import PLAIN, SPECULATE, ModeChooser
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams


class ScriptedChooser(ModeChooser):
    """`rounds` speculative rounds every `every` steps (never, for every = 0), else plain steps; it keeps the seconds
    of its plain steps by how many steps after the last speculative round they came."""

    def __init__(self, every: int, rounds: int) -> None:
        super().__init__()
        self.every, self.rounds, self.steps, self.after_round = every, rounds, 0, 10**9
        self.plain_s: dict[str, list[float]] = defaultdict(list)

    def choose(self, batch_size: int, options: tuple[str, ...] = (), lookahead: int = 0, unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
        return SPECULATE if self.every and self.steps % self.every < self.rounds else PLAIN

    def record(self, batch_size: int, choice: str, seconds: float, num_tokens: int,
               options: tuple[str, ...] = (), unseen: int = 0) -> None:
        self.steps += 1
        if choice != PLAIN:
            self.after_round = 0
            return
        self.after_round += 1
        self.plain_s["all"].append(seconds)
        self.plain_s["1st-4th after a round" if self.after_round <= 4 else "later"].append(seconds)


class GcClock:
    """The seconds Python's garbage collector spends, through gc.callbacks."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, 0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafts/smollm2-135m-draft4")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--every", type=int, default=32, help="steps between the starts of two probes")
    p.add_argument("--rounds", type=int, default=4, help="speculative rounds per probe")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target-core", type=int, default=None, help="pin this process to one core")
    a = p.parse_args()
    if a.target_core is not None:
        os.sched_setaffinity(0, {a.target_core})
    torch.set_num_threads(1)
    llm = LLM("smollm2-135m-instruct", dtype="bfloat16", num_threads=1, max_num_seqs=a.batch, speculation=(
        SpeculationConfig(ProposerChoice(a.draft), num_speculative_tokens=4, k_schedule=((a.batch, 4),))))
    prompts = render_prompts(llm, load_prompts("humaneval", a.batch))
    params = SamplingParams(max_tokens=a.tokens, ignore_eos=True, adaptive=True)
    llm.generate(prompts, params)  # warm-up
    cases = {"plain only": (0, 0), f"{a.rounds} rounds every {a.every} steps": (a.every, a.rounds)}
    times: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in cases}
    for _ in range(a.repeats):
        for name, (every, rounds) in cases.items():
            llm.engine.mode_chooser = chooser = ScriptedChooser(every, rounds)
            gc.callbacks.append(clock := GcClock())
            llm.generate(prompts, params)
            gc.callbacks.remove(clock)
            for part, seconds in chooser.plain_s.items():
                times[name][part].append(1e3 * statistics.median(seconds))
            times[name]["gc ms in the run"].append(1e3 * clock.seconds)
    for name, parts in times.items():
        for part, values in parts.items():
            what = "" if part.startswith("gc") else " median ms per plain step"
            print(f"{name:28s} {part:24s}{what}: " + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
