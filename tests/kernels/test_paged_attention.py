"""The Triton paged-attention kernel against its torch reference: decode, verify, trees, splits, checks."""

import pytest
import torch

pytest.importorskip("triton")

from ssd_kernels import paged_attention as paged_attention_module  # noqa: E402
from ssd_kernels.packed_mask import pack_sequence_masks  # noqa: E402
from ssd_kernels.paged_attention import paged_attention, paged_attention_reference  # noqa: E402
from tests.kernels.paged_batch import make_batch, tree_cases  # noqa: E402
from tests.kernels.tolerances import assert_close, differs  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SEQ_LENS = [1, 15, 16, 17, 64, 65]  # one key, and both sides of the block boundaries


def both(batch, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel output, reference output) for one batch."""
    out = paged_attention(*batch.args(), block_size=batch.block_size, **kwargs)
    kwargs.pop("num_splits", None)
    return out, paged_attention_reference(*batch.args(), block_size=batch.block_size, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("q_len", [1, 5, 16])
def test_decode_and_verify_match_the_reference(device, dtype, block_size, group, q_len):
    batch = make_batch([max(n, q_len) for n in SEQ_LENS], [q_len] * len(SEQ_LENS), group=group,
                       block_size=block_size, dtype=dtype, device=device)
    out, ref = both(batch)
    assert out.dtype == dtype and out.shape == batch.q.shape
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_ragged_query_counts(device, dtype, group):
    batch = make_batch([1, 20, 16, 65, 33], [1, 5, 16, 3, 12], group=group, dtype=dtype, device=device,
                       head_dim=32)
    assert_close(*both(batch))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_trees_and_ssd_branches_match_the_reference(device, dtype, block_size, group):
    cases = tree_cases()
    masks = [mask for _, _, mask in cases]
    batch = make_batch([n for _, n, _ in cases], [m.shape[0] for m in masks], group=group,
                       block_size=block_size, dtype=dtype, device=device)
    mask_start, tree_mask = (t.to(device) for t in pack_sequence_masks(masks))
    assert_close(*both(batch, mask_start=mask_start, tree_mask=tree_mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_key_splits_combine_to_the_unsplit_result(device, dtype, num_splits):
    batch = make_batch([300, 1, 129], [1, 1, 16], group=3, dtype=dtype, device=device)
    out, ref = both(batch, num_splits=num_splits)
    assert_close(out, ref)
    assert_close(out, paged_attention(*batch.args(), block_size=16, num_splits=1))


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("head_dim", [24, 96])  # not powers of two; 96 reads keys in tiles of 32
def test_head_dims(device, block_size, head_dim):
    batch = make_batch([17, 40, 65], [5, 1, 16], group=3, head_dim=head_dim, block_size=block_size,
                       device=device)
    assert_close(*both(batch))


def test_long_query_runs_over_a_cached_prefix(device):
    batch = make_batch([70, 40], [40, 33], group=3, device=device)  # prefill chunks: 120 rows in two chunks
    assert_close(*both(batch))


def test_a_query_that_sees_no_key_gets_zeros(device):
    batch = make_batch([20], [2], device=device)
    masks = [torch.zeros(2, 20, dtype=torch.bool)]
    masks[0][1, 3] = True
    mask_start, tree_mask = (t.to(device) for t in pack_sequence_masks(masks))
    out, ref = both(batch, mask_start=mask_start, tree_mask=tree_mask)
    assert out[0].abs().max() == 0
    assert_close(out, ref)


def _shift_block_table(batch, kwargs):  # every block id off by one, still inside the cache
    num_blocks = batch.kv_cache.shape[2] // batch.block_size
    table = batch.block_tables
    batch.block_tables = torch.where(table >= 0, (table + 1) % num_blocks, table)


def _seq_len_off_by_one(batch, kwargs):
    batch.seq_lens = batch.seq_lens - 1


def _flip_one_mask_bit(batch, kwargs):
    words = kwargs["tree_mask"].clone()
    words[3, 0] ^= 1 << 4
    kwargs["tree_mask"] = words


@pytest.mark.parametrize("perturb", [_shift_block_table, _seq_len_off_by_one, _flip_one_mask_bit])
def test_a_perturbed_input_is_caught(device, perturb):
    cases = tree_cases()[:3]
    masks = [mask for _, _, mask in cases]
    batch = make_batch([n for _, n, _ in cases], [m.shape[0] for m in masks], group=3, device=device)
    mask_start, tree_mask = (t.to(device) for t in pack_sequence_masks(masks))
    kwargs = dict(mask_start=mask_start, tree_mask=tree_mask)
    ref = paged_attention_reference(*batch.args(), block_size=16, **kwargs)
    assert_close(paged_attention(*batch.args(), block_size=16, **kwargs), ref)
    perturb(batch, kwargs)
    assert differs(paged_attention(*batch.args(), block_size=16, **kwargs), ref)


def _call(batch, **overrides):
    """paged_attention on `batch` with some arguments replaced."""
    names = ["q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc", "max_query_len",
             "scale"]
    args = dict(zip(names, batch.args(), strict=True)) | overrides
    return paged_attention(**args, block_size=batch.block_size)


BAD_INPUTS = {
    "q dtype unlike the cache": (lambda b: dict(q=b.q.half()), "k_cache must have dtype"),
    "int64 block tables": (lambda b: dict(block_tables=b.block_tables.long()), "block_tables must have"),
    "non-contiguous q": (lambda b: dict(q=b.q.transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
    "non-contiguous block tables": (lambda b: dict(block_tables=b.block_tables.t().contiguous().t()),
                                    "block_tables must be contiguous"),
    "seq_lens of the wrong length": (lambda b: dict(seq_lens=b.seq_lens[:1]), "seq_lens must be"),
    "H not a multiple of KVH": (lambda b: dict(q=b.q[:, :3].contiguous()), "multiple of KVH"),
    "v_cache unlike k_cache": (lambda b: dict(v_cache=b.kv_cache[1][:1]), "v_cache must be"),
    "zero max_query_len": (lambda b: dict(max_query_len=0), "max_query_len"),
    "zero num_splits": (lambda b: dict(num_splits=0), "num_splits"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_the_launcher_rejects_bad_inputs(device, name):
    batch = make_batch([17, 5], [3, 1], num_kv_heads=2, group=2, device=device)
    overrides, message = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=message):
        _call(batch, **overrides(batch))


def test_the_launcher_rejects_half_a_tree(device):
    batch = make_batch([17, 5], [3, 1], device=device)
    with pytest.raises(ValueError, match="mask_start and tree_mask go together"):
        paged_attention(*batch.args(), block_size=16, mask_start=batch.seq_lens)


def test_cpu_tensors_need_the_interpreter(device, monkeypatch):
    if device.type != "cpu":
        pytest.skip("CPU tensors only")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        _call(make_batch([17], [1]))


def test_the_gpu_plan_splits_keys_only_when_the_batch_leaves_sms_idle(monkeypatch):
    monkeypatch.setattr(paged_attention_module, "_num_sms", lambda device: 132)  # an H100 / H200
    gpu = torch.device("cuda")
    small = paged_attention_module._plan(1, 8, 4, 128, 32768, gpu, None)  # batch 1, 32k keys, D=128, G=4
    assert (small.block_m, small.block_n, small.num_row_chunks) == (16, 32, 1)
    assert (small.num_splits, small.tiles_per_split) == (32, 32)  # 264 programs asked; 1024 tiles in 32s
    assert paged_attention_module._plan(64, 8, 4, 128, 32768, gpu, None).num_splits == 1
    assert paged_attention_module._plan(1, 8, 4, 128, 64, gpu, None).num_splits == 1  # too few keys to split
    assert paged_attention_module._plan(1, 8, 4, 128, 32768, torch.device("cpu"), None).num_splits == 1
