"""Prefill attention (flash-attn varlen or SDPA) against its reference and paged attention's reference."""

import pytest
import torch

from ssd_kernels.paged_attention import paged_attention_reference
from ssd_kernels.prefill_attention import prefill_attention, prefill_attention_reference
from tests.kernels.paged_batch import make_batch
from tests.kernels.tolerances import assert_close


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3])
def test_prefill_matches_the_reference(dtype, group):
    gen = torch.Generator().manual_seed(0)
    q_lens, k_lens = [1, 15, 17, 5], [1, 15, 17, 33]  # the last: 5 new tokens after 28 cached keys
    q = torch.randn(sum(q_lens), 2 * group, 32, generator=gen).to(dtype)
    k, v = (torch.randn(sum(k_lens), 2, 32, generator=gen).to(dtype) for _ in range(2))
    args = (q, k, v, _cu(q_lens), _cu(k_lens), max(q_lens), max(k_lens), 32**-0.5)
    assert_close(prefill_attention(*args), prefill_attention_reference(*args))


def test_prefill_reference_agrees_with_paged_attention():
    batch = make_batch([16, 40, 7], [16, 9, 7], group=3)
    keys, values = [], []  # each sequence's keys gathered in position order
    for b, n in enumerate(batch.seq_lens.tolist()):
        positions = torch.arange(n)
        slots = batch.block_tables[b].long()[positions // 16] * 16 + positions % 16
        keys.append(batch.kv_cache[0][:, slots].transpose(0, 1))  # [n, KVH, D]
        values.append(batch.kv_cache[1][:, slots].transpose(0, 1))
    args = (batch.q, torch.cat(keys), torch.cat(values), batch.query_start_loc, _cu(batch.seq_lens.tolist()),
            batch.max_query_len, int(batch.seq_lens.max()), batch.scale)
    paged = paged_attention_reference(*batch.args(), block_size=16)
    torch.testing.assert_close(prefill_attention_reference(*args), paged, atol=1e-5, rtol=1e-5)


def test_prefill_rejects_bad_inputs():
    q, k = torch.randn(4, 3, 16), torch.randn(4, 2, 16)
    with pytest.raises(ValueError, match="multiple of KVH"):
        prefill_attention(q, k, k, _cu([4]), _cu([4]), 4, 4, 0.25)
    with pytest.raises(ValueError, match="cu_seqlens_q must have dtype"):
        prefill_attention(q[:, :2], k, k, _cu([4]).long(), _cu([4]), 4, 4, 0.25)
