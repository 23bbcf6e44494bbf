"""Acceptance of a draft model (`--kind model`) on held-out prompts, as evaluate.py measures a head's.

A draft model drafting greedily along the target's own continuation sees exactly the teacher-forced context
(each accepted token is the target's), so one forward of the draft over a trace gives every round's proposals:
a chain round starting with x_0..x_n committed accepts the run of consecutive hits from position n (hit j: the
draft's argmax after x_j is x_{j+1}). The temperature estimate sums min(p, q) along the same path. The forward is
the serving engine's (DraftModelProposer's worker), so the numbers are those of the model as it is served.
"""

from pathlib import Path
from typing import Any

import torch

from draft_training.chain_sim import ChainStats
from draft_training.evaluate import EvalConfig, HeldOutPrompt, Trace, build_traces
from draft_training.target_features import TargetFeatureExtractor
from ssd.context import ForwardMode
from ssd.dtypes import parse_dtype
from ssd.model_config import load_model_config
from ssd.model_store import resolve_model
from ssd.models.eagle3 import default_aux_layers
from ssd.runtime.model_runner import ForwardItem
from ssd.speculation.draft_model import DraftModelProposer, _DraftSeq


def draft_logits(proposer: DraftModelProposer, tokens: list[int]) -> torch.Tensor:
    """[T, Vd] float32: the draft's next-token logits after each position of `tokens` (one prefill)."""
    state = _DraftSeq()
    blocks = proposer.worker.block_manager
    blocks.ensure_capacity(state, len(tokens))
    try:
        item = ForwardItem(tokens, 0, state.block_table, num_logits=len(tokens))
        return proposer.worker.runner.forward([item], ForwardMode.PREFILL).logits.float().cpu()
    finally:
        blocks.free(state)


def chain_rounds(hits: torch.Tensor, prompt_len: int, k: int, stats: ChainStats) -> None:
    """Greedy chain rounds of lookahead k over one trace's hits [T-1] (bool)."""
    total = hits.numel() + 1
    n = prompt_len
    while n < total - 1:
        verifiable = min(k, total - 1 - n)
        accepted = 0
        while accepted < verifiable and bool(hits[n + accepted]):
            accepted += 1
        stats.add(accepted, verifiable)
        n += accepted + 1


def expected_rounds(logits: torch.Tensor, trace: Trace, target_ids: torch.Tensor, k: int, temperature: float,
                    stride: int = 2) -> torch.Tensor:
    """Per round (every `stride` tokens) and draft position i: sum_t min(p_i(t), q_i(t)) -> [rounds, k]."""
    starts = list(range(trace.prompt_len, len(trace.tokens) - k, stride))
    if not starts:
        return torch.zeros(0, k)
    rows = torch.tensor(starts)[:, None] + torch.arange(k)  # [rounds, k] positions n + i - 1
    p = torch.softmax(trace.target_logits[rows] / temperature, dim=-1)[..., target_ids]  # [rounds, k, Vd]
    q = torch.softmax(logits[rows] / temperature, dim=-1)  # [rounds, k, Vd]
    return torch.minimum(p, q).sum(-1)


def evaluate_draft_model(config: EvalConfig, prompts: list[HeldOutPrompt]) -> dict[str, Any]:
    """Chains K = 1..max_k, teacher-forced top-1, the temperature estimate and per-dataset K=5; no token tree."""
    if config.engine.num_threads:
        torch.set_num_threads(config.engine.num_threads)
    target = Path(config.engine.model)
    proposer = DraftModelProposer(resolve_model(config.draft), "float32", load_model_config(target).vocab_size)
    vocab = proposer.vocab
    target_ids = vocab.target_ids if vocab.target_ids is not None else torch.arange(vocab.target_size)  # [Vd]
    aux = default_aux_layers(load_model_config(target).num_hidden_layers)  # the traces' features go unused
    traces = build_traces(config, prompts, TargetFeatureExtractor(target, parse_dtype(config.engine.dtype), aux))
    rows = [draft_logits(proposer, t.tokens.tolist()) for t in traces]  # [T, Vd] each
    hits = [target_ids[r[:-1].argmax(-1)] == t.tokens[1:] for r, t in zip(rows, traces, strict=True)]  # [T-1]
    answer = [h[t.prompt_len - 1 :] for h, t in zip(hits, traces, strict=True)]
    generated = torch.cat([t.tokens[t.prompt_len :] for t in traces])
    in_vocab = torch.zeros(vocab.target_size, dtype=torch.bool)
    in_vocab[target_ids] = True
    report: dict[str, Any] = {
        "num_sequences": len(traces), "num_generated_tokens": int(generated.numel()),
        "draft_vocab_coverage_heldout": round(float(in_vocab[generated].float().mean()), 4),
        "teacher_forced_top1": round(float(torch.cat(answer).float().mean()), 4),
    }
    report["chain"] = {k: _chain(hits, traces, k, lambda t: True) for k in range(1, config.max_k + 1)}
    expected = torch.cat([expected_rounds(r, t, target_ids, config.temperature_k, config.temperature)
                          for r, t in zip(rows, traces, strict=True)])
    reach = expected.cumprod(dim=1)  # P(at least i accepted)
    report["temperature"] = {
        "temperature": config.temperature, "k": config.temperature_k,
        "mean_tokens_per_round": round(float(1 + reach.sum(1).mean()), 3),
        "acceptance_per_position": [round(float(x), 3) for x in expected.mean(0)],
    }
    k = min(5, config.max_k)
    report["by_dataset"] = {name: {"k": k, "mean_tokens_per_round": _chain(
        hits, traces, k, lambda t, name=name: t.dataset == name)["mean_tokens_per_round"]}
        for name in sorted({t.dataset for t in traces})}
    return report


def _chain(hits: list[torch.Tensor], traces: list[Trace], k: int, keep: Any) -> dict[str, Any]:
    stats = ChainStats(k)
    for h, t in zip(hits, traces, strict=True):
        if keep(t):
            chain_rounds(h, t.prompt_len, k, stats)
    return stats.summary()
