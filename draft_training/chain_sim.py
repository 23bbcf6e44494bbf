"""Simulated greedy chain speculation with an EAGLE-3 head over one recorded target trace (see evaluate.py).

The head's cache always holds exactly the true-feature positions 0..n-1 of the committed prefix between
rounds; drafted positions are rolled back with `truncate(n)`.
"""

from typing import Any, Protocol

import torch

from ssd.models.eagle3 import Eagle3Head, HeadKVCache


class TraceLike(Protocol):
    tokens: torch.Tensor  # [T] int64
    prompt_len: int
    features: torch.Tensor  # [T, 3*d]
    target_logits: torch.Tensor  # [T, V]


class ChainStats:
    """Rounds, tokens, and how many rounds reached / accepted each draft position."""

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.num_rounds = 0
        self.num_tokens = 0
        self.num_accepted = [0] * (max_k + 1)  # [i]: rounds whose accepted count >= i
        self.num_tried = [0] * (max_k + 1)  # [i]: rounds that reached position i with i verifiable

    def add(self, accepted: int, verifiable: int) -> None:
        self.num_rounds += 1
        self.num_tokens += accepted + 1
        for i in range(1, min(accepted + 1, verifiable) + 1):
            self.num_tried[i] += 1
        for i in range(1, accepted + 1):
            self.num_accepted[i] += 1

    def summary(self) -> dict[str, Any]:
        rate = [self.num_accepted[i] / self.num_tried[i] if self.num_tried[i] else 0.0
                for i in range(1, self.max_k + 1)]
        return {"rounds": self.num_rounds, "mean_tokens_per_round": round(self.num_tokens / max(1, self.num_rounds), 3),
                "acceptance_per_position": [round(r, 3) for r in rate]}


def catch_up(head: Eagle3Head, tokens: torch.Tensor, fused: torch.Tensor, cache: HeadKVCache,
             n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed true positions cache.length..n-1; returns the last position's (out_hidden [1, d], logits [Vd])."""
    start = cache.length
    out, logits = head(tokens[start + 1 : n + 1], fused[start:n], cache)
    return out[-1:], logits[-1]


def simulate_chain(head: Eagle3Head, trace: TraceLike, k: int, stats: ChainStats) -> None:
    tokens, total = trace.tokens, len(trace.tokens)
    fused = head.fuse(trace.features.to(head.fc.weight.dtype))  # [T, d]
    cache = head.new_cache(total + k + 1)
    n = trace.prompt_len  # x_0..x_n committed: x_n is the target's first sampled token
    while n < total - 1:
        hidden, logits = catch_up(head, tokens, fused, cache, n)
        verifiable = min(k, total - 1 - n)
        accepted = 0
        for i in range(1, verifiable + 1):
            draft = head.to_target_ids(logits.argmax())
            if int(draft) != int(tokens[n + i]):
                break
            accepted = i
            if i < verifiable:
                hidden, step_logits = head(draft.view(1), hidden, cache)
                logits = step_logits[0]
        cache.truncate(n)
        stats.add(accepted, verifiable)
        n += accepted + 1


def temperature_rounds(head: Eagle3Head, trace: TraceLike, k: int, temperature: float,
                       stride: int = 2) -> torch.Tensor:
    """Per round (starts every `stride` tokens) and draft position i: sum_t min(p_i(t), q_i(t)) at `temperature`,
    drafting along the target's own path -> [rounds, k]. Expected tokens per round = 1 + sum_i prod_{j<=i} alpha_j."""
    tokens, total = trace.tokens, len(trace.tokens)
    fused = head.fuse(trace.features.to(head.fc.weight.dtype))
    draft_to_target = head.to_target_ids(torch.arange(head.config.draft_vocab_size))  # [Vd]
    cache = head.new_cache(total + k + 1)
    rows = []
    for n in range(trace.prompt_len, total - k, stride):
        hidden, logits = catch_up(head, tokens, fused, cache, n)
        alphas = []
        for i in range(1, k + 1):
            p = torch.softmax(trace.target_logits[n + i - 1] / temperature, dim=-1)[draft_to_target]  # [Vd]
            q = torch.softmax(logits / temperature, dim=-1)  # [Vd]
            alphas.append(torch.minimum(p, q).sum())
            if i < k:
                hidden, step_logits = head(tokens[n + i].view(1), hidden, cache)
                logits = step_logits[0]
        cache.truncate(n)
        rows.append(torch.stack(alphas))
    return torch.stack(rows) if rows else torch.zeros(0, k)


def teacher_forced_hits(head: Eagle3Head, trace: TraceLike) -> tuple[int, int]:
    """(hits, positions): the head's top-1 against the target's next token at every answer position, with true
    features everywhere. Rounds in `simulate_chain` start only after a rejection (harder positions); this
    is the number to compare with the training log's validation top-1."""
    tokens = trace.tokens
    fused = head.fuse(trace.features.to(head.fc.weight.dtype))  # [T, d]
    _, logits = head(tokens[1:], fused[:-1], head.new_cache(len(tokens)))  # row j predicts x_{j+2}
    rows = torch.arange(trace.prompt_len - 1, len(tokens) - 2)  # predictions of the answer tokens x_{P+1}..
    predicted = head.to_target_ids(logits[rows].argmax(-1))
    return int((predicted == tokens[rows + 2]).sum()), len(rows)
