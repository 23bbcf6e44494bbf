"""bench.attention_kernels: its argument handling, and a clear exit where there is no GPU."""

import pytest
import torch

from bench.attention_kernels import main, parse_args


def test_defaults_are_the_llama_8b_decode_grid():
    args = parse_args([])
    assert (args.batches, args.contexts) == ([1, 8, 64], [512, 4096, 32768])
    assert (args.heads, args.kv_heads, args.head_dim, args.block_size) == (32, 8, 128, 16)
    assert parse_args(["--batches", "2,4", "--contexts", "100"]).batches == [2, 4]


def test_bad_head_counts_are_rejected():
    with pytest.raises(SystemExit):
        parse_args(["--heads", "30"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a GPU")
def test_exits_with_a_message_without_cuda():
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["--output", "/dev/null"])
