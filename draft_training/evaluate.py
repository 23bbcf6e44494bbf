"""Acceptance of a draft head, by exact teacher-forced simulation of speculation against the target's own
greedy continuation (no engine speculation loop needed).

Per held-out prompt the target generates its greedy continuation x_P..x_{T-1}; one teacher-forced target
forward gives its features g_j and logits at every position. A round starts with x_0..x_n committed: the
head has read true features for positions 0..n-1, drafts K tokens (self-conditioning after the first), and
the longest prefix equal to x_{n+1}.. is accepted; the round yields accepted + 1 tokens and n advances by that.
"""

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import structlog
import torch
from tqdm.auto import tqdm

from draft_training.chain_sim import ChainStats, simulate_chain, teacher_forced_hits, temperature_rounds
from draft_training.target_features import TargetFeatureExtractor
from draft_training.tree_sim import simulate_tree
from ssd.config import EngineConfig
from ssd.dtypes import parse_dtype
from ssd.loader.eagle3_checkpoint import load_eagle3_config, load_eagle3_head

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class EvalConfig:
    engine: EngineConfig  # the target's (model = its checkpoint folder; the head runs in float32)
    draft: str  # EAGLE-3 head folder
    num_prompts: int = 16  # per data set
    max_new_tokens: int = 128
    max_k: int = 8  # chains K = 1..max_k
    tree_budget: int = 16  # draft tokens per token tree
    tree_branching: int = 2  # children considered per expanded node
    temperature: float = 0.7  # for the expected-acceptance estimate
    temperature_k: int = 5


@dataclass(frozen=True)
class HeldOutPrompt:
    dataset: str
    text: str
    is_chat: bool


@dataclass(frozen=True)
class Trace:
    """One held-out sequence with everything the simulation needs."""

    dataset: str
    tokens: torch.Tensor  # [T] int64: prompt + the target's greedy continuation
    prompt_len: int  # P
    features: torch.Tensor  # [T, 3*d] float32
    target_logits: torch.Tensor  # [T, V] float32: the target's logits after each position


def build_traces(config: EvalConfig, prompts: list[HeldOutPrompt], extractor: TargetFeatureExtractor) -> list[Trace]:
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    options = {f.name: getattr(config.engine, f.name) for f in fields(config.engine)}
    llm = LLM(**{**options, "max_num_seqs": len(prompts)})  # one batch of every prompt
    encoded = [llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": p.text}]) if p.is_chat else p.text)
               for p in prompts]
    outputs = llm.generate(encoded, SamplingParams(temperature=0.0, max_tokens=config.max_new_tokens), use_tqdm=True)
    traces = []
    for p, ids, out in zip(prompts, encoded, outputs, strict=True):
        seq = ids + out.token_ids
        captured = extractor.extract([seq])[0]
        traces.append(Trace(p.dataset, torch.tensor(seq), len(ids), captured.features.float(), captured.logits))
    return traces


def evaluate_head(config: EvalConfig, prompts: list[HeldOutPrompt]) -> dict[str, Any]:
    """Simulate chains K = 1..max_k, a token tree, and the temperature estimate; return the report."""
    if config.engine.num_threads:
        torch.set_num_threads(config.engine.num_threads)
    draft_config = load_eagle3_config(Path(config.draft))
    extractor = TargetFeatureExtractor(Path(config.engine.model), parse_dtype(config.engine.dtype),
                                       draft_config.aux_layers)
    head = load_eagle3_head(Path(config.draft), extractor.embedding.float(), torch.float32)
    traces = build_traces(config, prompts, extractor)
    report: dict[str, Any] = {"num_sequences": len(traces), "num_generated_tokens":
                              sum(len(t.tokens) - t.prompt_len for t in traces)}
    generated = torch.cat([t.tokens[t.prompt_len :] for t in traces])
    report["draft_vocab_coverage_heldout"] = round(float(head.t2d[generated].float().mean()), 4)
    with torch.no_grad():
        hits = [teacher_forced_hits(head, t) for t in traces]
        report["teacher_forced_top1"] = round(sum(h for h, _ in hits) / max(1, sum(n for _, n in hits)), 4)
        chains = {}
        for k in tqdm(range(1, config.max_k + 1), desc="chain K"):
            stats = ChainStats(k)
            for t in traces:
                simulate_chain(head, t, k, stats)
            chains[k] = stats.summary()
        report["chain"] = chains
        tree = ChainStats(config.tree_budget)
        for t in tqdm(traces, desc="tree"):
            simulate_tree(head, t, config.tree_budget, config.tree_branching, config.max_k, tree)
        report["tree"] = {"budget": config.tree_budget, "branching": config.tree_branching, **tree.summary()}
        expected = [temperature_rounds(head, t, config.temperature_k, config.temperature) for t in traces]
        rounds = torch.cat(expected)  # [rounds, K] per-position acceptance probabilities
        reach = rounds.cumprod(dim=1)  # P(at least i accepted)
        report["temperature"] = {
            "temperature": config.temperature, "k": config.temperature_k,
            "mean_tokens_per_round": round(float(1 + reach.sum(1).mean()), 3),
            "acceptance_per_position": [round(float(x), 3) for x in rounds.mean(0)],
        }
    report["by_dataset"] = _by_dataset(head, traces, config)
    return report


def _by_dataset(head: torch.nn.Module, traces: list[Trace], config: EvalConfig) -> dict[str, Any]:
    k = min(5, config.max_k)
    out = {}
    with torch.no_grad():
        for name in sorted({t.dataset for t in traces}):
            stats = ChainStats(k)
            for t in traces:
                if t.dataset == name:
                    simulate_chain(head, t, k, stats)
            out[name] = {"k": k, "mean_tokens_per_round": stats.summary()["mean_tokens_per_round"]}
    return out


def format_report(report: dict[str, Any]) -> str:
    lines = [f"sequences: {report['num_sequences']}, generated tokens: {report['num_generated_tokens']}, "
             f"held-out draft-vocab coverage: {report['draft_vocab_coverage_heldout']}, teacher-forced top-1 at "
             f"every answer position: {report.get('teacher_forced_top1', '-')}", "",
             "| K | mean tokens / round | acceptance per position (conditional) |", "|---|---|---|"]
    for k, s in report["chain"].items():
        lines.append(f"| {k} | {s['mean_tokens_per_round']:.3f} | {' '.join(f'{a:.2f}' for a in s['acceptance_per_position'])} |")
    tree = report.get("tree")  # a draft model's report has none
    temp = report["temperature"]
    lines += [""] + ([f"tree (best-first, branching {tree['branching']}, {tree['budget']} draft tokens): "
                      f"{tree['mean_tokens_per_round']:.3f} tokens / round (greedy)"] if tree else [])
    lines += [f"temperature {temp['temperature']} chain K={temp['k']} (expected, sum of min(p, q)): "
              f"{temp['mean_tokens_per_round']:.3f} tokens / round; per position "
              f"{' '.join(f'{a:.2f}' for a in temp['acceptance_per_position'])}"]
    for name, s in report["by_dataset"].items():
        lines.append(f"{name}: chain K={s['k']} {s['mean_tokens_per_round']:.3f} tokens / round")
    return "\n".join(lines)

