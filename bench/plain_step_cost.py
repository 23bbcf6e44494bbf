"""Does a plain decode step cost more in an engine that speculates? One process, bf16, one thread.

    python -m bench.plain_step_cost [--draft drafts/smollm2-135m-draft4] [--batch 16] [--tokens 64] [--repeats 3]
        [--remote --target-core 0 --draft-core 1]

Times a batch's decode steps (prefill excluded), interleaved: the AR engine; the speculating engine with requests in
mode ar; the speculating engine with adaptive requests whose mode chooser always picks plain steps. `--remote` adds
an engine whose draft is a draft service in its own process (as `ssd bench --mode ssd` runs it), its adaptive
requests held to plain steps too: what an idle remote draft costs the target's plain steps.
"""

import argparse
import os
import time
from collections.abc import Collection

import torch

from bench.datasets import load_prompts
from bench.runner import render_prompts
from ssd.config import DecodeMode, ProposerChoice, SpeculationConfig
from ssd.engine.mode_choice import PLAIN, ModeChooser
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams


class AlwaysPlain(ModeChooser):
    def choose(self, batch_size: int, options: tuple[str, ...] = (), lookahead: int = 0,
               unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
        return PLAIN


def ms_per_step(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> float:
    outs = llm.generate(prompts, params)
    decode_s = max(o.latency_s or 0.0 for o in outs) - max(o.ttft_s or 0.0 for o in outs)
    return 1e3 * decode_s / (params.max_tokens - 1)


def remote_engine(draft: str, batch: int, opts: dict, closers: list) -> LLM:
    """A target engine whose proposals come from a draft service on `--draft-core` (its session open)."""
    from bench.draft_process import DraftProcess
    from target_service.remote_proposer import RemoteProposer

    process = DraftProcess(draft, "smollm2-135m-instruct", "bfloat16", opts.pop("draft_core"))
    closers.append(process.close)
    llm = LLM("smollm2-135m-instruct", speculation=SpeculationConfig(
        ProposerChoice(draft), num_speculative_tokens=4, k_schedule=((batch, 4),)),
        proposer=(proposer := RemoteProposer(process.address, "bench", 49152, timeout_s=30.0)), **opts)
    closers.append(proposer.close)
    deadline = time.monotonic() + 30
    while not proposer.is_connected and time.monotonic() < deadline:
        time.sleep(0.1)
    return llm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", default="drafts/smollm2-135m-draft4")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--remote", action="store_true", help="add an engine with a draft service in its own process")
    p.add_argument("--target-core", type=int, default=None, help="pin this process to one core")
    p.add_argument("--draft-core", type=int, default=None, help="--remote: pin the draft service to one core")
    a = p.parse_args()
    if a.target_core is not None:
        os.sched_setaffinity(0, {a.target_core})
    torch.set_num_threads(1)
    opts = dict(dtype="bfloat16", num_threads=1, max_num_seqs=a.batch)
    ar = LLM("smollm2-135m-instruct", **opts)
    sd = LLM("smollm2-135m-instruct", speculation=SpeculationConfig(
        ProposerChoice(a.draft), num_speculative_tokens=4, k_schedule=((a.batch, 4),)), **opts)
    sd.engine.mode_chooser = AlwaysPlain()
    prompts = render_prompts(ar, load_prompts("mtbench", a.batch))
    params = SamplingParams(max_tokens=a.tokens, ignore_eos=True)
    adaptive = SamplingParams(max_tokens=a.tokens, ignore_eos=True, adaptive=True)
    cases = {"ar engine": (ar, params),
             "speculating engine, mode ar": (sd, SamplingParams(max_tokens=a.tokens, ignore_eos=True, mode="ar")),
             "speculating engine, adaptive, always plain": (sd, adaptive)}
    closers: list = []
    if a.remote:
        remote = remote_engine(a.draft, a.batch, {**opts, "draft_core": a.draft_core}, closers)
        remote.engine.mode_chooser = AlwaysPlain()
        cases["remote-draft engine, adaptive ssd, always plain"] = (
            remote, SamplingParams(max_tokens=a.tokens, ignore_eos=True, adaptive=True, mode=DecodeMode.SSD))
    try:
        for llm, case_params in cases.values():  # warm-up
            llm.generate(prompts[:2], case_params)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(a.repeats):
            for name, (llm, case_params) in cases.items():
                times[name].append(ms_per_step(llm, prompts, case_params))
    finally:
        for close in reversed(closers):
            close()
    for name, values in times.items():
        print(f"{name:48s} ms per batch step: " + " ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main()
