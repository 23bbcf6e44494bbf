"""Teacher-forced target forwards that capture, per position, the features an EAGLE-3 head reads and the
target's next-token distribution.

Owns its own copy of the target and its own KV cache (never the serving engine's), so the paged blocks it
overwrites can hold nobody else's prefix cache.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from ssd.context import ForwardMode
from ssd.kv.kv_cache import KVCacheShape, allocate_kv_cache
from ssd.layers.linear import pack_linear_weights
from ssd.loader.model_loader import load_model
from ssd.model_config import ModelConfig
from ssd.runtime.model_runner import ForwardItem, ModelRunner

BLOCK_SIZE = 16


@dataclass(frozen=True)
class SequenceFeatures:
    features: torch.Tensor  # [n, 3*d] the aux layers' entering residual streams, concatenated
    logits: torch.Tensor  # [n, V] float32: the target's next-token logits after each position


@dataclass(frozen=True)
class CapturedSequence:
    """One stored training sequence: what a shard keeps of each position."""

    tokens: list[int]  # prompt + answer, n target ids
    prompt_len: int
    features: torch.Tensor  # [n, 3*d] bfloat16
    topk_ids: torch.Tensor  # [n, k] int32 target ids: the target's top-k after each position
    topk_logprobs: torch.Tensor  # [n, k] float32


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, V] logits -> the k most likely ids [n, k] int32 and their log-probabilities [n, k] float32."""
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return ids.to(torch.int32), values


class TargetFeatureExtractor:
    def __init__(self, folder: Path, dtype: torch.dtype, aux_layers: tuple[int, ...],
                 max_batch_tokens: int = 4096) -> None:
        self.model, self.config = load_model(folder, dtype)
        pack_linear_weights(self.model)
        self.aux_layers = tuple(sorted(aux_layers))
        self.max_batch_tokens = max_batch_tokens
        mc: ModelConfig = self.config
        shape = KVCacheShape(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, BLOCK_SIZE, dtype)
        self.kv_shape = shape
        self.num_blocks = 0
        self.reserve_blocks(-(-max_batch_tokens // BLOCK_SIZE) + 64)

    def reserve_blocks(self, num_blocks: int) -> None:
        """Grow the KV cache to at least `num_blocks` blocks (its contents are not kept)."""
        if num_blocks <= self.num_blocks:
            return
        self.num_blocks = num_blocks
        kv_cache = allocate_kv_cache(self.model, self.kv_shape, num_blocks, torch.device("cpu"))
        self.runner = ModelRunner(self.model, BLOCK_SIZE, torch.device("cpu"), kv_cache)

    @property
    def embedding(self) -> torch.Tensor:  # [V, d]
        return self.model.model.embed_tokens.weight

    def _forward_group(self, group: list[list[int]]) -> list[SequenceFeatures]:
        items, next_block = [], 0
        for ids in group:
            num = -(-len(ids) // BLOCK_SIZE)
            items.append(ForwardItem(ids, 0, list(range(next_block, next_block + num)), num_logits=len(ids)))
            next_block += num
        out = self.runner.forward(items, ForwardMode.PREFILL, aux_layers=self.aux_layers)
        features = out.aux_hidden  # [sum n, 3*d]: every fed token of every item, in order
        result, offset = [], 0
        for ids in group:
            n = len(ids)
            result.append(SequenceFeatures(features[offset : offset + n], out.logits[offset : offset + n]))
            offset += n
        return result

    def extract(self, sequences: list[list[int]]) -> list[SequenceFeatures]:
        """Features and logits for each token-id sequence, batched up to `max_batch_tokens` tokens a forward."""
        result: list[SequenceFeatures] = []
        group: list[list[int]] = []
        for ids in sequences:
            if len(ids) > self.max_batch_tokens:
                raise ValueError(f"a sequence of {len(ids)} tokens exceeds max_batch_tokens={self.max_batch_tokens}")
            if group and sum(map(len, group)) + len(ids) > self.max_batch_tokens:
                result.extend(self._forward_group(group))
                group = []
            group.append(ids)
        if group:
            result.extend(self._forward_group(group))
        return result

    def capture(self, sequences: list[list[int]], prompt_lens: list[int], top_k: int) -> list[CapturedSequence]:
        """Teacher-forced capture of whole sequences (prompt + answer already known), as shards store them."""
        captured = []
        for ids, prompt_len, f in zip(sequences, prompt_lens, self.extract(sequences), strict=True):
            top_ids, top_values = topk_logprobs(f.logits, top_k)
            captured.append(CapturedSequence(list(ids), prompt_len, f.features.to(torch.bfloat16), top_ids, top_values))
        return captured
