"""Time the SSD cache build against the verify forward it has to hide behind, in one process.

    python -m bench.ssd_build --batch 1,4,16 --temp 0,0.7 --output-len 48 --threads 1

For each (batch, temperature): SSD with the shipped EAGLE-3 head generates `--output-len` tokens for `batch`
prompts (MT-Bench and HumanEval in turn). The build runs synchronously right after each answer (the speculator's
worker is an inline one), so build and verify never share the cores and each is timed alone. Prints, per case,
the mean build ms per round, the mean verify ms per round and their ratio (the build hides inside the verify
when <= 1).
Compare two checkouts by running this file with PYTHONPATH set to each, one after the other.
"""

import argparse
import json
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from bench.datasets import load_prompts
from ssd.config import Backup, ProposerChoice, SpeculationConfig, SsdConfig
from ssd.llm import LLM
from ssd.model_store import DEFAULT_DRAFT, DEFAULT_MODEL
from ssd.sampling.params import SamplingParams


def _prompts(llm: LLM, batch: int) -> list[list[int]]:
    pool = [p for pair in zip(load_prompts("mtbench", 8), load_prompts("humaneval", 8), strict=True) for p in pair]
    texts = [llm.chat_prompt([{"role": "user", "content": p.text}]) if p.is_chat else p.text for p in pool]
    return [llm.tokenizer.encode(texts[i % len(texts)]) for i in range(batch)]


class InlineWorker:
    """A SpeculatorWorker that runs every call at once on the caller's thread, so that a cache build never overlaps
    the verify and each is timed alone."""

    def __init__(self) -> None:
        self.build_windows: deque[tuple[float, float]] = deque(maxlen=256)
        self.num_failed_builds = 0

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with torch.inference_mode():
            return fn(*args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        done: Future = Future()
        done.set_result(self.call(fn, *args))
        return done

    def submit_build(self, build: Callable[..., None], job: object) -> Future:
        started = time.perf_counter()
        done = self.submit(build, job)
        self.build_windows.append((started, time.perf_counter()))
        return done

    def close(self) -> None:
        pass


def serial_ssd_llm(model: str, draft: str, k: int, dtype: str) -> LLM:
    """An SSD engine whose speculator answers and builds one after the other, on the caller's thread."""
    speculation = SpeculationConfig(ProposerChoice(draft), num_speculative_tokens=k, k_schedule=((64, k),),
                                    ssd=SsdConfig(backup=Backup.NEURAL, fit_fan_out=False))
    llm = LLM(model, dtype=dtype, speculation=speculation)
    overlapped = llm.engine.speculative_decoder.proposer
    overlapped.worker.close()
    overlapped.worker = InlineWorker()
    return llm


def time_case(llm: LLM, batch: int, temperature: float, output_len: int) -> dict[str, float]:
    """Mean build and verify milliseconds per round for one batch of `batch` sequences."""
    decoder = llm.engine.speculative_decoder
    ssd = decoder.proposer.counters
    before = (decoder.counters.num_rounds, decoder.counters.verify_s, ssd.num_builds, ssd.build_s)
    params = SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True, seed=0)
    started = time.perf_counter()
    llm.generate(_prompts(llm, batch), [params] * batch)
    wall = time.perf_counter() - started
    rounds = decoder.counters.num_rounds - before[0]
    verify_ms = 1e3 * (decoder.counters.verify_s - before[1]) / max(rounds, 1)
    build_ms = 1e3 * (ssd.build_s - before[3]) / max(ssd.num_builds - before[2], 1)
    return {"batch": batch, "temperature": temperature, "rounds": rounds, "build_ms": round(build_ms, 2),
            "verify_ms": round(verify_ms, 2), "build_over_verify": round(build_ms / verify_ms, 3),
            "wall_s": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--batch", default="1,4,16")
    parser.add_argument("--temp", default="0,0.7")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = serial_ssd_llm(args.model, args.draft, args.k, args.dtype)
    time_case(llm, 1, 0.0, 8)  # warm-up
    for batch in (int(b) for b in args.batch.split(",")):
        for temperature in (float(t) for t in args.temp.split(",")):
            print(json.dumps(time_case(llm, batch, temperature, args.output_len)), flush=True)


if __name__ == "__main__":
    main()
