"""The target's per-sequence deadlines, read when a sequence's Prefill goes to the draft."""

from target_service.seq_deadlines import SeqDeadlines


def test_time_left_counts_down_to_zero_and_clears():
    d = SeqDeadlines()
    assert d.time_left_ms(1) is None  # no deadline: the Prefill leaves time_left_ms unset
    d.set(1, 10.0)
    assert d.time_left_ms(1, now=9.25) == 750
    assert d.time_left_ms(1, now=11.0) == 0  # passed: the draft refuses the Prefill at once
    d.clear(1)
    assert d.time_left_ms(1) is None and len(d) == 0


def test_a_prefill_carries_the_time_left_only_when_there_is_a_deadline():
    import time
    from types import SimpleNamespace

    import torch

    from protos.ssd.v1 import draft_pb2
    from ssd.speculation.proposer import ProposeRequest
    from target_service.remote_proposer import RemoteProposer

    proposer = RemoteProposer("127.0.0.1:9", "t", vocab_size=100, reconnect_interval_s=60)  # never connects
    try:
        proposer.deadlines.set(1, time.monotonic() + 2.0)
        round_ = draft_pb2.Round()
        for seq_id in (1, 2):
            proposer._entry(SimpleNamespace(known={}, sends_features=False), ProposeRequest(seq_id, [1, 2], 3, 0.0, torch.Generator()),
                            round_)
    finally:
        proposer.close()
    with_deadline, without = round_.prefills
    assert 1000 < with_deadline.time_left_ms <= 2000
    assert not without.HasField("time_left_ms")
