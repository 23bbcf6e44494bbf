"""Tokens per round of SD and SSD settings, in one process: each group of prompts runs every setting in turn.

SSD runs in process (the speculator on its own worker thread): the same answer / build algorithm as the draft
service, so tokens per round, hit rates and the tokens after a hit / a miss are what `ssd bench --mode ssd` would
count, while its times are not the deployed ones (the build shares this process). For issue 26's reading of why
SSD's rounds carry fewer tokens than SD's, and what a setting changes there.

`PYTHONPATH=. python -m bench.ssd_rounds --numseqs 2 --output-len 96 --batch 4 --temp 0.7 --settings sd,ssd,ssd-bh`
(settings: sd; ssd; ssd-bh = ssd with backup_hits; ssd-floor = ssd with round_hit_floor 0.1).
"""

import argparse
import copy
import json
import time

import torch

from bench.datasets import load_prompts
from bench.runner import render_prompts
from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation.speculation_stats import SpecStats

SETTINGS = {"sd": None, "ssd": SsdConfig(), "ssd-bh": SsdConfig(backup_hits=True),
            "ssd-floor": SsdConfig(round_hit_floor=0.1)}
FIELDS = ("num_drafts", "num_emitted_tokens", "num_cache_hits", "num_cache_misses", "emitted_after_hit",
          "emitted_after_miss", "verify_s", "propose_s", "num_rounds")


def _llm(setting: str, batch: int, k: int, draft: str) -> LLM:
    spec = SpeculationConfig(ProposerChoice(draft), num_speculative_tokens=k, k_schedule=((batch, k),), ssd=SETTINGS[setting])
    return LLM(dtype="bfloat16", num_threads=1, max_num_seqs=batch, kv_cache_memory_mb=256, speculation=spec)


def _row(a: dict[str, float]) -> dict[str, float]:
    """Summary of summed counter deltas: tokens per round, ms per round, and SSD's hit split."""
    row = {"tokens_per_round": a["num_emitted_tokens"] / a["num_drafts"],
           "verify_ms": 1e3 * a["verify_s"] / a["num_rounds"], "propose_ms": 1e3 * a["propose_s"] / a["num_rounds"]}
    lookups = a["num_cache_hits"] + a["num_cache_misses"]
    if lookups:
        row.update(hit_rate=a["num_cache_hits"] / lookups,
                   tokens_per_round_hit=a["emitted_after_hit"] / max(a["num_cache_hits"], 1),
                   tokens_per_round_miss=a["emitted_after_miss"] / max(a["num_cache_misses"], 1))
    return row


def run(settings: list[str], numseqs: int, output_len: int, batch: int, temp: float, k: int,
        draft: str) -> dict[str, dict[str, float]]:
    """-> {"setting dataset": summary}; every setting sees the same groups, one after the other."""
    torch.set_num_threads(1)
    llms = {s: _llm(s, batch, k, draft) for s in settings}
    prompts = load_prompts("all", numseqs)
    encoded = render_prompts(llms[settings[0]], prompts)
    params = SamplingParams(temperature=temp, max_tokens=output_len, ignore_eos=True, seed=1234)
    sums: dict[str, dict[str, float]] = {}
    for i in range(0, len(encoded), batch):
        for s in settings:
            counters: SpecStats = llms[s].engine.speculative_decoder.counters
            before = copy.deepcopy(counters)
            llms[s].generate(encoded[i : i + batch], params)
            total = sums.setdefault(f"{s} {prompts[i].dataset}", dict.fromkeys(FIELDS, 0.0))
            for f in FIELDS:
                total[f] += getattr(counters, f) - getattr(before, f)
    return {key: _row(a) for key, a in sums.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="sd,ssd", help=f"comma-separated, from {', '.join(SETTINGS)}")
    p.add_argument("--numseqs", type=int, default=2, help="prompts per data set")
    p.add_argument("--output-len", type=int, default=96)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--draft", default="smollm2-135m-eagle3")
    a = p.parse_args()
    started = time.time()
    rows = run(a.settings.split(","), a.numseqs, a.output_len, a.batch, a.temp, a.k, a.draft)
    for key, row in rows.items():
        print(key, json.dumps({n: round(v, 3) for n, v in row.items()}))
    print(f"wall {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
