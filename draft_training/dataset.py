"""The on-disk self-distillation data, loaded into memory and cut into padded training batches.

One sequence of n target tokens x_0..x_{n-1} gives n-1 head positions: position j reads (x_{j+1}, g_j) and
learns the target's distribution after x_{j+1} (stored row j+1). Unroll step s at position j learns row j+1+s.
A draft model (ModelBatch) needs no features: its position j reads x_j and learns stored row j.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ssd.errors import InvalidRequestError


@dataclass(frozen=True)
class DistilledSequence:
    tokens: torch.Tensor  # [n] int64 target ids
    features: torch.Tensor  # [n, 3*d] bfloat16
    topk_ids: torch.Tensor  # [n, k] int64 target ids: the target's top-k after each position
    topk_logprobs: torch.Tensor  # [n, k] float32
    prompt_len: int


def _read_shard(path: Path, with_features: bool) -> dict[str, torch.Tensor]:
    if with_features:
        return load_file(str(path))
    with safe_open(str(path), framework="pt") as f:  # the features are most of a shard's bytes
        t = {k: f.get_tensor(k) for k in f.keys() if k != "features"}  # noqa: SIM118 - safe_open is not a mapping
    t["features"] = torch.zeros(int(t["seq_starts"][-1]), 0, dtype=torch.bfloat16)  # [N, 0]
    return t


def load_sequences(shards: list[Path], min_len: int = 3, with_features: bool = True) -> list[DistilledSequence]:
    """Every sequence of at least `min_len` tokens; without features, `features` is [n, 0] (draft models)."""
    if not shards:
        raise InvalidRequestError("no training data shards")
    sequences = []
    for path in shards:
        t = _read_shard(path, with_features)
        starts = t["seq_starts"].tolist()
        for i, prompt_len in enumerate(t["prompt_lens"].tolist()):
            a, b = starts[i], starts[i + 1]
            if b - a >= min_len:
                sequences.append(DistilledSequence(t["tokens"][a:b].long(), t["features"][a:b], t["topk_ids"][a:b].long(),
                                          t["topk_logprobs"][a:b], prompt_len))
    return sequences


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # [B, L] the token each head position reads (x_{j+1}); 0 in padding
    features: torch.Tensor  # [B, L, 3*d] float32 target features g_j
    attention_mask: torch.Tensor  # [B, L] bool: real head positions
    label_ids: torch.Tensor  # [B, L + S - 1, k] draft ids of the target's top-k after x_{j+1}; -1 = not in vocab
    label_probs: torch.Tensor  # [B, L + S - 1, k] their probabilities (0 where -1 or padding)
    weights: torch.Tensor  # [B, L + S - 1] loss weight of each label row (0 = none)


def make_batch(seqs: list[DistilledSequence], target_to_draft: torch.Tensor, num_unroll: int,
               prompt_loss_weight: float) -> Batch:
    """Right-padded batch; label row r of a sequence is its stored row r+1, valid while r+1 < n."""
    b = len(seqs)
    length = max(len(s.tokens) - 1 for s in seqs)
    rows = length + num_unroll - 1
    k = seqs[0].topk_ids.shape[1]
    input_ids = torch.zeros(b, length, dtype=torch.long)
    features = torch.zeros(b, length, seqs[0].features.shape[1])
    mask = torch.zeros(b, length, dtype=torch.bool)
    label_ids = torch.full((b, rows, k), -1, dtype=torch.long)
    label_probs = torch.zeros(b, rows, k)
    weights = torch.zeros(b, rows)
    for i, s in enumerate(seqs):
        n = len(s.tokens) - 1  # head positions of this sequence
        input_ids[i, :n] = s.tokens[1:]
        features[i, :n] = s.features[:-1].float()
        mask[i, :n] = True
        ids = target_to_draft[s.topk_ids[1:]]  # [n, k]
        probs = s.topk_logprobs[1:].exp() * (ids >= 0)
        label_ids[i, :n] = ids
        label_probs[i, :n] = probs
        # row r predicts token x_{r+2}: an answer token when r + 2 >= prompt_len
        r = torch.arange(n)
        weights[i, :n] = torch.where(r + 2 >= s.prompt_len, 1.0, prompt_loss_weight)
    return Batch(input_ids, features, mask, label_ids, label_probs, weights)


@dataclass(frozen=True)
class ModelBatch:
    """A draft model's batch: position j reads x_j and learns the target's distribution after it (row j)."""

    input_ids: torch.Tensor  # [B, L] target ids; 0 in padding
    attention_mask: torch.Tensor  # [B, L] bool: real positions
    label_ids: torch.Tensor  # [B, L, k] draft ids of the target's top-k after x_j; -1 = not in the draft vocab
    label_probs: torch.Tensor  # [B, L, k] their probabilities (0 where -1 or padding)
    weights: torch.Tensor  # [B, L] loss weight of each position (0 = padding)


def make_model_batch(seqs: list[DistilledSequence], target_to_draft: torch.Tensor,
                     prompt_loss_weight: float) -> ModelBatch:
    """Right-padded; row j of a sequence predicts x_{j+1}: an answer token (weight 1) when j + 1 >= prompt_len."""
    b, length = len(seqs), max(len(s.tokens) for s in seqs)
    k = seqs[0].topk_ids.shape[1]
    input_ids = torch.zeros(b, length, dtype=torch.long)
    mask = torch.zeros(b, length, dtype=torch.bool)
    label_ids = torch.full((b, length, k), -1, dtype=torch.long)
    label_probs = torch.zeros(b, length, k)
    weights = torch.zeros(b, length)
    for i, s in enumerate(seqs):
        n = len(s.tokens)
        ids = target_to_draft[s.topk_ids]  # [n, k]
        input_ids[i, :n] = s.tokens
        mask[i, :n] = True
        label_ids[i, :n] = ids
        label_probs[i, :n] = s.topk_logprobs.exp() * (ids >= 0)
        weights[i, :n] = torch.where(torch.arange(n) + 1 >= s.prompt_len, 1.0, prompt_loss_weight)
    return ModelBatch(input_ids, mask, label_ids, label_probs, weights)


def batch_plan(lengths: list[int], batch_tokens: int, generator: torch.Generator) -> list[list[int]]:
    """DistilledSequence indices grouped by similar length into batches of <= batch_tokens padded tokens, shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    perm = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[p] for p in perm]
