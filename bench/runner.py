"""Time decoding modes over a list of prompts; decode throughput is kept apart from prefill.

A group of `batch` prompts is generated together; its prefill time is the time to the last
first token, its decode time the rest. Every prompt generates exactly `output_len` tokens
(EOS does not stop it). Several modes and batch sizes run in one process, one after another,
so their ratios are measured under the same machine conditions.
"""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from tqdm.auto import tqdm

from bench.datasets import Prompt
from bench.hf_baseline import HFGenerator
from bench.timing import GroupTiming
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams


@dataclass(frozen=True)
class BenchSettings:
    mode: str
    model: str
    dataset: str
    output_len: int
    batch: int
    temperature: float
    dtype: str
    threads: int
    warmup: int = 1


def _render(llm: LLM, prompts: list[Prompt]) -> list[list[int]]:
    texts = [llm.chat_prompt([{"role": "user", "content": p.text}]) if p.is_chat else p.text for p in prompts]
    return [llm.tokenizer.encode(t) for t in texts]


def _engine_runner(llm: LLM, params: SamplingParams) -> Callable[[list[list[int]]], GroupTiming]:
    def run(group: list[list[int]]) -> GroupTiming:
        outs = llm.generate(group, params)
        prefill = max(o.ttft_s or 0.0 for o in outs)
        total = max(o.latency_s or 0.0 for o in outs)
        return GroupTiming([o.token_ids for o in outs], prefill, total)

    return run


def run_benchmarks(base: BenchSettings, modes: list[str], batches: list[int], prompts: list[Prompt]) -> list[dict]:
    """Every (mode, batch) pair over the same prompts, in this process; one result dict each."""
    torch.set_num_threads(base.threads)
    llm = LLM(base.model, dtype=base.dtype, num_threads=base.threads, max_num_seqs=max(batches))
    encoded = _render(llm, prompts)
    params = SamplingParams(temperature=base.temperature, max_tokens=base.output_len, ignore_eos=True, seed=1234)
    results = []
    for mode in modes:
        if mode == "hf":
            hf = HFGenerator(llm.engine.info.model_path, base.dtype)
            run = lambda group: hf.generate(group, base.output_len, base.temperature)  # noqa: E731
        else:
            run = _engine_runner(llm, params)
        for batch in batches:
            settings = replace(base, mode=mode, batch=batch)
            for i in range(min(base.warmup, len(encoded))):
                run(encoded[i : i + 1])
            timings = [
                run(encoded[i : i + batch])
                for i in tqdm(range(0, len(encoded), batch), desc=f"bench {mode} batch {batch}", unit="group")
            ]
            results.append(summarize(settings, encoded, timings))
    return results


def summarize(s: BenchSettings, encoded: list[list[int]], timings: list[GroupTiming]) -> dict:
    outputs = [ids for t in timings for ids in t.token_ids]
    num_out = sum(len(ids) for ids in outputs)
    decode_tokens = num_out - len(outputs)  # each sequence's first token belongs to prefill
    decode_s = sum(t.total_s - t.prefill_s for t in timings)
    total_s = sum(t.total_s for t in timings)
    return {
        **asdict(s),
        "num_prompts": len(encoded),
        "prompt_tokens": sum(len(p) for p in encoded),
        "output_tokens": num_out,
        "decode_tok_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        "ttft_s": sum(t.prefill_s for t in timings) / len(timings),
        "total_tok_s": num_out / total_s if total_s > 0 else 0.0,
        "total_s": total_s,
        "outputs_sha256": hashlib.sha256(json.dumps(outputs).encode()).hexdigest(),
        "date": time.strftime("%Y-%m-%d"),
    }
