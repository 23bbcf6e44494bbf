"""Few-query paged attention on AMX-BF16 tiles (ssd_kernels/cpu/attention_amx.cpp) against the torch path: head
sizes 64 and 128, 1-16 query columns per pass and more than one pass, keys read in place from consecutive slots or
copied from scattered ones, lengths around the tiles' 16 and 32 keys. A query gets the same bits in a decode step, a
verify, a batch or on two threads, whichever layout of the scores its pass takes; a planted bug is caught."""

import pytest
import torch

from ssd.layers import cpu_kernels
from ssd_kernels.cpu import extension as own_ext
from tests.kernels.attention_cases import attention_case, reference_attention
from tests.kernels.cpu_kernel_checks import relative_error, require_path

AMX = own_ext.AMX_BF16
TOLERANCE = 2e-2  # relative to max |torch|: bfloat16 output rounding


@pytest.fixture
def amx(ext):
    return require_path(ext, {"amx-bf16": AMX}, "amx-bf16")


def _attend(ext, case, q, path):
    queries, cache, kv_slots, seq_lens = case
    return ext.paged_attention(queries, cache, kv_slots, seq_lens, q, queries.shape[-1] ** -0.5, path)


# (heads, kv_heads, d, q): columns per KV head = heads / kv_heads x q -> the scores' layout of 4, 8 or 16 a key,
# and two passes where they pass 16
SHAPES = [(9, 3, 64, 1), (9, 3, 64, 2), (9, 3, 64, 5), (32, 8, 128, 1), (32, 8, 128, 5), (12, 2, 64, 3)]


@pytest.mark.parametrize(("heads", "kv_heads", "d", "q"), SHAPES)
@pytest.mark.parametrize("block", [None, 16])
def test_amx_attention_matches_the_torch_path(ext, amx, heads, kv_heads, d, q, block):
    case = attention_case(torch.bfloat16, [5, 16, 33, 200], q, heads=heads, kv_heads=kv_heads, d=d, block=block)
    out = _attend(ext, case, q, amx)
    assert relative_error(out, reference_attention(*case, q, d**-0.5)) < TOLERANCE
    loops = _attend(ext, case, q, 0)
    assert relative_error(out, loops) < TOLERANCE


@pytest.mark.parametrize(("heads", "kv_heads", "d", "q"), SHAPES)
def test_a_query_gets_the_same_bits_as_a_decode_step_in_a_batch_and_on_two_threads(ext, amx, heads, kv_heads, d, q):
    """Each query of a verify (Q queries a sequence) equals that query decoded alone (Q = 1 over the keys it sees):
    a decode pass lays its 3 or 4 columns out 4 a key, a verify 8 or 16, so the layouts agree bit for bit."""
    queries, cache, kv_slots, seq_lens = case = attention_case(torch.bfloat16, [21, 48, 200], q, heads=heads,
                                                               kv_heads=kv_heads, d=d, block=16)
    batch = _attend(ext, case, q, amx)
    for b in range(len(seq_lens)):
        for i in range(q):
            row = b * q + i
            alone = ext.paged_attention(queries[row : row + 1], cache, kv_slots[b : b + 1],
                                        seq_lens[b : b + 1] - (q - 1 - i), 1, d**-0.5, amx)
            assert torch.equal(batch[row : row + 1], alone), (b, i)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(_attend(ext, case, q, amx), batch)
    finally:
        torch.set_num_threads(threads)


def test_a_planted_off_by_one_in_the_causal_bound_is_caught(ext, amx):
    """Letting each query see one key fewer fails the comparison with the torch path."""
    queries, cache, kv_slots, seq_lens = case = attention_case(torch.bfloat16, [9, 40], 3, heads=9, kv_heads=3, d=64)
    wrong = ext.paged_attention(queries, cache, kv_slots, seq_lens - 1, 3, 0.125, amx)
    assert relative_error(wrong, reference_attention(*case, 3, 0.125)) > TOLERANCE


def test_the_amx_path_refuses_what_it_does_not_serve(ext, amx):
    for dtype, d in ((torch.float32, 64), (torch.bfloat16, 32)):
        case = attention_case(dtype, [9], 1, heads=4, kv_heads=2, d=d)
        with pytest.raises(RuntimeError, match="AMX path takes bfloat16"):
            _attend(ext, case, 1, amx)
    with pytest.raises(RuntimeError, match="path 0"):
        _attend(ext, attention_case(torch.bfloat16, [9], 1, heads=4, kv_heads=2, d=64), 1, 3)


def test_a_model_takes_the_amx_path_for_bfloat16_unless_switched_off(ext, amx, monkeypatch):
    assert cpu_kernels.attention_path(torch.bfloat16, 64) == AMX
    assert cpu_kernels.attention_path(torch.bfloat16, 128) == AMX
    assert cpu_kernels.attention_path(torch.float32, 64) == 0
    assert cpu_kernels.attention_path(torch.bfloat16, 96) == 0
    monkeypatch.setenv(cpu_kernels.AMX_ENV, "0")
    assert cpu_kernels.attention_path(torch.bfloat16, 64) == 0
