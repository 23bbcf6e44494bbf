"""The torch reference of paged attention against the engine's gather + dense-mask attention (trusted)."""

import pytest
import torch
from torch import nn

from ssd.context import ForwardMode
from ssd.runtime.model_runner import ForwardItem, ModelRunner
from ssd_kernels.packed_mask import pack_sequence_masks
from ssd_kernels.paged_attention import paged_attention_reference
from tests.kernels.paged_batch import PagedBatch, make_batch, tree_cases


def engine_attention(batch: PagedBatch, masks: list[torch.Tensor] | None = None) -> torch.Tensor:  # [T, H, D]
    """The engine's torch attention backend (gather + dense mask) over the same cache, through the runner's own
    context."""
    runner = ModelRunner(nn.Identity(), batch.block_size, torch.device("cpu"), batch.kv_cache[None])
    q_lens = (batch.query_start_loc[1:] - batch.query_start_loc[:-1]).tolist()
    items = [ForwardItem([0] * n, int(batch.seq_lens[b]) - n, batch.block_table(b),
                         attn_mask=None if masks is None else masks[b]) for b, n in enumerate(q_lens)]
    ctx, _, _ = runner.build_context(items, ForwardMode.TREE)
    return ctx.backend.attend(batch.q, batch.kv_cache, ctx, batch.scale)


Q_LENS = [[1] * 6, [1, 5, 5, 5, 5, 5], [1, 15, 16, 16, 16, 16], [1, 5, 16, 3, 2, 9]]


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("q_lens", Q_LENS)
def test_causal_reference_matches_the_engine(block_size, group, q_lens):
    batch = make_batch([1, 15, 16, 17, 64, 65], q_lens, group=group, block_size=block_size)
    out = paged_attention_reference(*batch.args(), block_size=block_size)
    torch.testing.assert_close(out, engine_attention(batch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("group", [1, 3])
def test_tree_reference_matches_the_engine(block_size, group):
    cases = tree_cases()
    masks = [mask for _, _, mask in cases]
    batch = make_batch([n for _, n, _ in cases], [m.shape[0] for m in masks], group=group,
                       block_size=block_size)
    mask_start, tree_mask = pack_sequence_masks(masks)
    out = paged_attention_reference(*batch.args(), block_size=block_size, mask_start=mask_start,
                                    tree_mask=tree_mask)
    torch.testing.assert_close(out, engine_attention(batch, masks), atol=1e-5, rtol=1e-5)


def test_a_causal_tree_mask_is_the_causal_default():
    batch = make_batch([17, 40], [5, 16], group=3)
    masks = [torch.ones(5, 17, dtype=torch.bool).tril(diagonal=12),
             torch.ones(16, 40, dtype=torch.bool).tril(diagonal=24)]
    mask_start, tree_mask = pack_sequence_masks(masks)
    tree = paged_attention_reference(*batch.args(), block_size=16, mask_start=mask_start, tree_mask=tree_mask)
    torch.testing.assert_close(tree, paged_attention_reference(*batch.args(), block_size=16), atol=0, rtol=0)


def test_reference_rejects_a_too_small_max_query_len():
    batch = make_batch([17, 40], [5, 16])
    batch.max_query_len = 8
    with pytest.raises(ValueError, match="max_query_len"):
        paged_attention_reference(*batch.args(), block_size=16)
