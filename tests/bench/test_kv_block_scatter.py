"""The scattered-block attention bench builds the block tables it says it times."""

import torch

from bench.kv_block_scatter import BLOCK, NUM_BLOCKS, block_table


def test_block_tables_are_runs_of_consecutive_blocks_in_a_random_order():
    gen = torch.Generator().manual_seed(0)
    for run in (1, 4, 64):
        table = block_table(1000, run, gen).tolist()
        assert len(table) == -(-1000 // BLOCK) and len(set(table)) == len(table)
        assert all(0 <= b < NUM_BLOCKS for b in table)
        for start in range(0, len(table), run):  # each run: consecutive ids from a multiple of `run`
            chunk = table[start : start + run]
            assert chunk[0] % run == 0 and chunk == list(range(chunk[0], chunk[0] + len(chunk)))
