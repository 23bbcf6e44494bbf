"""A released sequence leaves no state in any per-sequence dict of the EAGLE-3 / SSD draft stack (the proposer,
its branch drafter's glue hidden states, the SSD speculator, the overlapped wrapper's records). Once the
drafter kept glue hidden states of released sequences: the draft service's RSS crept up in a soak."""

import torch

from ssd.config import DecodeMode, SsdConfig
from ssd.model_config import load_model_config
from ssd.speculation.draft_record import DraftRecord
from ssd.speculation.eagle3_branches import Eagle3BranchDrafter
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.speculator_worker import OverlappedSpeculator
from ssd.speculation.ssd_speculator import SsdSpeculator
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

K = 3


def _keyed_by(obj: object, seq_id: int) -> list[str]:
    """Names of obj's dict attributes that hold seq_id as a key."""
    return [name for name, value in vars(obj).items() if isinstance(value, dict) and seq_id in value]


def _head_stack(tmp_path) -> tuple:  # noqa: ANN001
    """(target config, EAGLE-3 proposer, its branch drafter) over a tiny target and head."""
    target, head_dir = tmp_path / "target", tmp_path / "head"
    hf = write_tiny_checkpoint(target, "llama", seed=0).float().eval()
    write_tiny_head(head_dir, target)
    tc = load_model_config(target)
    proposer = Eagle3Proposer(head_dir, hf.model.embed_tokens.weight.detach(), tc, "float32")
    return tc, proposer, Eagle3BranchDrafter(proposer)


def test_release_forgets_the_sequence_everywhere(tmp_path):
    tc, proposer, drafter = _head_stack(tmp_path)
    ssd = SsdSpeculator(proposer, drafter, SsdConfig(backup="neural", fan_out_budget=8))
    overlapped = OverlappedSpeculator(ssd)
    torch.manual_seed(0)
    tokens = {1: [5, 6, 7, 8, 9], 2: [20, 21, 22, 23]}
    requests = [ProposeRequest(i, t, K, 0.0, torch.Generator(), None, torch.randn(len(t) - 1, 3 * tc.hidden_size), 0)
                for i, t in tokens.items()]  # features [P-1, 3d] each
    try:
        overlapped.propose(requests)
        overlapped.worker.call(lambda: None)  # the build has run
        holders = (overlapped, ssd, drafter, proposer)
        assert all(_keyed_by(o, 1) for o in (overlapped, proposer)), "the test must see state to free"
        record = overlapped.records[1]
        assert record.cache, "the build filled the record's cache"
        overlapped.release(1)
        overlapped.worker.call(lambda: None)  # the release queued behind it has run too
        assert [name for o in holders for name in _keyed_by(o, 1)] == [] and record.is_released
        assert all(_keyed_by(o, 2) for o in (overlapped, proposer))  # the other sequence keeps its state
    finally:
        overlapped.close()


def test_release_frees_everything_keyed_by_the_sequence(tmp_path):
    tc, proposer, drafter = _head_stack(tmp_path)
    ssd = SsdSpeculator(proposer, drafter, SsdConfig(backup="neural", fan_out_budget=0))  # no branches: glue only
    torch.manual_seed(0)
    tokens = {1: [5, 6, 7, 8, 9], 2: [20, 21, 22, 23]}
    requests = [ProposeRequest(i, t, 3, 0.7, torch.Generator().manual_seed(i), None,
                               torch.randn(len(t) - 1, 3 * tc.hidden_size), 0) for i, t in tokens.items()]
    records = {i: DraftRecord(i, t, 0.7, torch.Generator().manual_seed(i), mode=DecodeMode.SSD) for i, t in tokens.items()}
    _, job = ssd.answer(requests, list(records.values()))
    ssd.build(job)
    assert set(drafter.glue_hidden) == {1, 2}  # glue rows of sequences that forked no branch stay until released
    assert not [name for name, value in vars(ssd).items() if isinstance(value, dict)]  # the speculator keeps none
    ssd.release(records[1])
    assert records[1].is_released and 1 not in proposer.seqs and 1 not in drafter.glue_hidden
    assert set(proposer.seqs) == set(drafter.glue_hidden) == {2} and not records[2].is_released
    ssd.release(records[2])
    assert records[2].is_released and not proposer.seqs and not drafter.glue_hidden
