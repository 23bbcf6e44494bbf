"""Does a plain decode step cost more in an engine that speculates? One process, batch 16, bf16, one thread.

    python -m bench.plain_step_cost [--draft drafts/smollm2-135m-draft4] [--batch 16] [--tokens 64] [--repeats 3]

Times a batch's decode steps (prefill excluded) three ways, interleaved: the AR engine; the speculating engine with
requests in mode ar; the speculating engine with adaptive requests whose mode chooser always picks plain steps.
"""

import argparse

import torch

from bench.datasets import load_prompts
from bench.runner import render_prompts
from ssd.config import ProposerChoice, SpeculationConfig
from ssd.engine.mode_choice import PLAIN, ModeChooser
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams


class AlwaysPlain(ModeChooser):
    def choose(self, batch_size: int) -> str:
        return PLAIN


def ms_per_step(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> float:
    outs = llm.generate(prompts, params)
    decode_s = max(o.latency_s or 0.0 for o in outs) - max(o.ttft_s or 0.0 for o in outs)
    return 1e3 * decode_s / (params.max_tokens - 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafts/smollm2-135m-draft4")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    opts = dict(dtype="bfloat16", num_threads=1, max_num_seqs=a.batch)
    ar = LLM("smollm2-135m-instruct", **opts)
    sd = LLM("smollm2-135m-instruct", speculation=SpeculationConfig(
        ProposerChoice(a.draft), num_speculative_tokens=4, k_schedule=((a.batch, 4),)), **opts)
    sd.engine.mode_chooser = AlwaysPlain()
    prompts = render_prompts(ar, load_prompts("mtbench", a.batch))
    params = SamplingParams(max_tokens=a.tokens, ignore_eos=True)
    cases = {"ar engine": (ar, params), "speculating engine, mode ar": (sd, SamplingParams(
                 max_tokens=a.tokens, ignore_eos=True, mode="ar")),
             "speculating engine, adaptive, always plain": (sd, SamplingParams(
                 max_tokens=a.tokens, ignore_eos=True, adaptive=True))}
    for llm, case_params in cases.values():  # warm-up
        llm.generate(prompts[:2], case_params)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(a.repeats):
        for name, (llm, case_params) in cases.items():
            times[name].append(ms_per_step(llm, prompts, case_params))
    for name, values in times.items():
        print(f"{name:44s} ms per batch step: " + " ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main()
