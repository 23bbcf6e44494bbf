"""Time one decoding mode over a list of prompts; decode throughput is kept apart from prefill.

A group of `batch` prompts is generated together; its prefill time is the time to the last
first token, its decode time the rest. Every prompt generates exactly `output_len` tokens.
"""

import hashlib
import json
import time
from dataclasses import asdict, dataclass

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
    tok = llm.tokenizer
    texts = [llm.chat_prompt([{"role": "user", "content": p.text}]) if p.is_chat else p.text for p in prompts]
    return [tok.encode(t) for t in texts]


def _run_engine(llm: LLM, group: list[list[int]], params: SamplingParams) -> GroupTiming:
    outs = llm.generate(group, params)
    prefill = max(o.ttft_s or 0.0 for o in outs)
    total = max(o.latency_s or 0.0 for o in outs)
    return GroupTiming([o.token_ids for o in outs], prefill, total)


def run_benchmark(s: BenchSettings, prompts: list[Prompt]) -> dict:
    torch.set_num_threads(s.threads)
    llm = LLM(s.model, dtype=s.dtype, num_threads=s.threads, max_num_seqs=max(s.batch, 1))
    encoded = _render(llm, prompts)
    params = SamplingParams(temperature=s.temperature, max_tokens=s.output_len, ignore_eos=True, seed=1234)
    if s.mode == "hf":
        hf = HFGenerator(llm.engine.info.model_path, s.dtype)
        run = lambda group: hf.generate(group, s.output_len, s.temperature)  # noqa: E731
    else:
        run = lambda group: _run_engine(llm, group, params)  # noqa: E731
    for i in range(min(s.warmup, len(encoded))):
        run(encoded[i : i + 1])
    timings = []
    for i in tqdm(range(0, len(encoded), s.batch), desc=f"bench {s.mode}", unit="group"):
        timings.append(run(encoded[i : i + s.batch]))
    return summarize(s, encoded, timings)


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
