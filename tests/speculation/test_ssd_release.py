"""Releasing a sequence frees everything SSD keyed by it: the speculator's record and cache, the EAGLE-3 branch
drafter's glue rows, and the head's KV and features (a soak once showed the glue rows of finished sequences
piling up)."""

import torch

from ssd.config import SsdConfig
from ssd.model_config import load_model_config
from ssd.speculation.eagle3_branches import Eagle3BranchDrafter
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.ssd_speculator import SsdSpeculator
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint


def test_release_frees_everything_keyed_by_the_sequence(tmp_path):
    target, head_dir = tmp_path / "target", tmp_path / "head"
    hf = write_tiny_checkpoint(target, "llama", seed=0).float().eval()
    write_tiny_head(head_dir, target)
    tc = load_model_config(target)
    proposer = Eagle3Proposer(head_dir, hf.model.embed_tokens.weight.detach(), tc, "float32")
    drafter = Eagle3BranchDrafter(proposer)
    ssd = SsdSpeculator(proposer, drafter, SsdConfig(backup="neural", fan_out_budget=0))  # no branches: glue only
    torch.manual_seed(0)
    tokens = {1: [5, 6, 7, 8, 9], 2: [20, 21, 22, 23]}
    requests = [ProposeRequest(i, t, 3, 0.7, torch.Generator().manual_seed(i), None,
                               torch.randn(len(t) - 1, 3 * tc.hidden_size), 0) for i, t in tokens.items()]
    _, job = ssd.answer(requests)
    ssd.build(job)
    assert set(drafter.glue_hidden) == {1, 2}  # glue rows of sequences that forked no branch stay until released
    ssd.release(1)
    assert 1 not in ssd.seqs and 1 not in proposer.seqs and 1 not in drafter.glue_hidden
    assert set(ssd.seqs) == set(proposer.seqs) == set(drafter.glue_hidden) == {2}
    ssd.release(2)
    assert not ssd.seqs and not proposer.seqs and not drafter.glue_hidden
