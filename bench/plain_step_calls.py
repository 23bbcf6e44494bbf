"""Python calls of a plain decode step: an AR engine against a speculating one whose adaptive requests stay plain.

    python -m bench.plain_step_calls [--tokens 256] [--top 8] [--target-core 0]

Profiles (cProfile) one generation of `--tokens` tokens of one HumanEval prompt in each engine (batch 1, bf16, one
thread, after a warm-up) and prints the function-call count and the functions with the most own time: where the
speculating engine's plain step spends more host work than the AR engine's, it shows here.
"""

import argparse
import cProfile
import io
import os
import pstats

import torch

from bench.datasets import load_prompts
from bench.plain_step_cost import AlwaysPlain
from bench.runner import render_prompts
from ssd.config import ProposerChoice, SpeculationConfig
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafts/smollm2-135m-draft4")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--top", type=int, default=8, help="functions to list per engine, by own time")
    p.add_argument("--target-core", type=int, default=None, help="pin this process to one core")
    a = p.parse_args()
    if a.target_core is not None:
        os.sched_setaffinity(0, {a.target_core})
    torch.set_num_threads(1)
    opts = dict(dtype="bfloat16", num_threads=1, max_num_seqs=1)
    ar = LLM("smollm2-135m-instruct", **opts)
    spec = LLM("smollm2-135m-instruct", speculation=SpeculationConfig(
        ProposerChoice(a.draft), num_speculative_tokens=4), **opts)
    spec.engine.mode_chooser = AlwaysPlain()
    prompts = render_prompts(ar, load_prompts("humaneval", 2))
    cases = {"ar engine": (ar, SamplingParams(max_tokens=a.tokens, ignore_eos=True)),
             "speculating engine, adaptive, always plain": (
                 spec, SamplingParams(max_tokens=a.tokens, ignore_eos=True, adaptive=True))}
    for name, (llm, params) in cases.items():
        llm.generate(prompts[:1], params)  # warm-up
        profile = cProfile.Profile()
        profile.enable()
        llm.generate(prompts[1:2], params)
        profile.disable()
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        print(f"== {name}: {stats.total_calls} function calls in {stats.total_tt:.2f} s")
        stats.sort_stats("tottime").print_stats(a.top)
        print("\n".join(line for line in out.getvalue().splitlines() if "(" in line or "ncalls" in line))


if __name__ == "__main__":
    main()
