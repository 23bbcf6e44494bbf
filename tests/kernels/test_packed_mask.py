"""The packed tree-mask format: bit order, the sign bit, and the choice of each sequence's mask_start."""

import torch

from ssd_kernels.packed_mask import pack_mask, pack_sequence_masks, unpack_mask


def test_bits_are_least_significant_first_and_bit_31_is_the_sign_bit():
    dense = torch.zeros(3, 40, dtype=torch.bool)
    dense[0, 0] = True
    dense[1, 31] = True
    dense[2, [1, 32, 39]] = True
    words = pack_mask(dense)  # [3, 2]
    assert words.dtype == torch.int32 and words.shape == (3, 2)
    assert words[0].tolist() == [1, 0]
    assert words[1].tolist() == [-(2**31), 0]  # bit 31 alone is INT32_MIN
    assert words[2].tolist() == [2, 1 + 2**7]


def test_unpack_inverts_pack():
    dense = torch.rand(7, 77, generator=torch.Generator().manual_seed(0)) < 0.5
    dense[:, 31] = True  # sign bits of the first word
    assert torch.equal(unpack_mask(pack_mask(dense), 77), dense)


def test_sequence_masks_start_at_the_longest_prefix_every_row_sees():
    causal = torch.ones(3, 10, dtype=torch.bool).tril(diagonal=7)  # 3 new tokens after 7 context keys
    tree = torch.zeros(2, 5, dtype=torch.bool)
    tree[:, :2] = True
    tree[0, 3] = tree[1, 4] = True
    mask_start, words = pack_sequence_masks([causal, tree])
    assert mask_start.tolist() == [8, 2]
    assert words.shape == (5, 1)
    assert unpack_mask(words, 3).tolist() == [
        [False, False, False], [True, False, False], [True, True, False],  # causal rows after key 8
        [False, True, False], [False, False, True],  # tree rows after key 2
    ]
