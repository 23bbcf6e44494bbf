"""Generation that records its own training data: one static batch of prompts is prefilled and decoded on the
feature extractor's copy of the target, and every forward keeps what the EAGLE-3 head learns from (the aux
layers' features and the target's top-k next-token log-probs). No second, teacher-forced pass over prompt +
answer is needed; that pass was about a quarter of the data stage.

Each sequence owns a fixed run of KV blocks (prompt + `max_new_tokens`), so nothing is scheduled or preempted.
A finished answer's last token is fed once more, so every stored position has its features and distribution,
exactly like a teacher-forced forward over the whole sequence.
"""

from dataclasses import dataclass, field

import torch

from draft_training.target_features import (
    BLOCK_SIZE,
    CapturedSequence,
    TargetFeatureExtractor,
    topk_logprobs,
)
from ssd.context import ForwardMode
from ssd.runtime.model_runner import ForwardItem
from ssd.sampling.params import SamplingParams
from ssd.sampling.sampler import sample_tokens


@dataclass
class _Row:
    prompt: list[int]
    blocks: list[int]  # the sequence's reserved KV blocks
    generator: torch.Generator
    answer: list[int] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)  # chunks [n, 3*d], in position order
    topk_ids: list[torch.Tensor] = field(default_factory=list)  # chunks [n, k]
    topk_logprobs: list[torch.Tensor] = field(default_factory=list)  # chunks [n, k]
    done: bool = False  # the answer is complete; its last token still has to be fed

    def keep(self, features: torch.Tensor, logits: torch.Tensor, top_k: int) -> None:
        ids, values = topk_logprobs(logits, top_k)
        self.features.append(features.to(torch.bfloat16))
        self.topk_ids.append(ids)
        self.topk_logprobs.append(values)

    def captured(self) -> CapturedSequence:
        return CapturedSequence(self.prompt + self.answer, len(self.prompt), torch.cat(self.features),
                                torch.cat(self.topk_ids), torch.cat(self.topk_logprobs))


def _reserve(extractor: TargetFeatureExtractor, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    tables, next_block = [], 0
    for p in prompts:
        num = -(-(len(p) + max_new_tokens) // BLOCK_SIZE)
        tables.append(list(range(next_block, next_block + num)))
        next_block += num
    extractor.reserve_blocks(next_block)
    return tables


def _prefill(extractor: TargetFeatureExtractor, rows: list[_Row], top_k: int) -> torch.Tensor:
    """Feed every prompt; returns the logits after each prompt's last token [B, V]."""
    last: list[torch.Tensor] = []
    group: list[_Row] = []

    def flush() -> None:
        items = [ForwardItem(r.prompt, 0, r.blocks, num_logits=len(r.prompt)) for r in group]
        out = extractor.runner.forward(items, ForwardMode.PREFILL, aux_layers=extractor.aux_layers)
        offset = 0
        for r in group:
            n = len(r.prompt)
            r.keep(out.aux_hidden[offset : offset + n], out.logits[offset : offset + n], top_k)
            last.append(out.logits[offset + n - 1])
            offset += n
        group.clear()

    for r in rows:
        if group and sum(len(g.prompt) for g in group) + len(r.prompt) > extractor.max_batch_tokens:
            flush()
        group.append(r)
    flush()
    return torch.stack(last)


def generate_captured(
    extractor: TargetFeatureExtractor,
    prompts: list[list[int]],
    params: SamplingParams,  # temperature / top-k / top-p / seed / stop ids of the answers; max_tokens caps them
    eos_token_ids: frozenset[int],
    top_k: int,
) -> list[CapturedSequence]:
    """Answer every prompt (one static batch) and capture every position of prompt + answer, in prompt order."""
    if not prompts:
        return []
    max_new = params.max_tokens
    stops = eos_token_ids | set(params.stop_token_ids)
    tables = _reserve(extractor, prompts, max_new)
    rows = []
    for i, (p, table) in enumerate(zip(prompts, tables, strict=True)):
        generator = torch.Generator().manual_seed((params.seed or 0) * 1_000_003 + i)
        rows.append(_Row(list(p), table, generator))
    logits = _prefill(extractor, rows, top_k)  # [B, V]
    active = rows
    with torch.inference_mode():
        while active:  # logits [len(active), V]: after each active row's last fed token
            picks = sample_tokens(logits, [params] * len(active), [r.generator for r in active])
            for r, token in zip(active, picks, strict=True):
                r.answer.append(token)
                r.done = token in stops or len(r.answer) >= max_new
            items = [ForwardItem([r.answer[-1]], len(r.prompt) + len(r.answer) - 1, r.blocks) for r in active]
            out = extractor.runner.forward(items, ForwardMode.DECODE, aux_layers=extractor.aux_layers)
            for i, r in enumerate(active):
                r.keep(out.aux_hidden[i : i + 1], out.logits[i : i + 1], top_k)
            still = [i for i, r in enumerate(active) if not r.done]
            active, logits = [active[i] for i in still], out.logits[still]
    return [r.captured() for r in rows]
