"""SentFeatures: a sequence's target features of positions 0.., replayable whole; overwrites and gaps."""

import torch

from target_service.sent_features import SentFeatures

F = 6


def rows(start: int, n: int) -> torch.Tensor:
    """[n, F]: row i holds position start + i (so a replay shows which positions it covers)."""
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].expand(n, F).clone()


def positions(t: torch.Tensor) -> list[int]:
    return t[:, 0].int().tolist()


def test_rounds_append_and_a_replay_covers_every_position():
    log = SentFeatures()
    log.add(1, 0, rows(0, 5))  # the prompt
    for start in range(5, 60, 3):  # rounds: more than the first buffer holds
        log.add(1, start, rows(start, 3))
    assert positions(log.replay(1)) == list(range(62))


def test_later_rows_overwrite_those_of_dropped_tokens():
    log = SentFeatures()
    log.add(1, 0, rows(0, 4))
    log.add(1, 2, 100 + rows(0, 1))  # position 2 again (its token changed), positions 3.. dropped
    assert positions(log.replay(1)) == [0, 1, 100]


def test_a_gap_leaves_the_sequence_out_and_release_forgets_it():
    log = SentFeatures()
    log.add(1, 0, rows(0, 3))
    log.add(1, 5, rows(5, 2))  # positions 3 and 4 never came
    assert log.replay(1) is None
    log.add(2, 0, rows(0, 2))
    log.add(2, 2, rows(2, 1).to(torch.bfloat16))  # a dtype change keeps what was held
    assert positions(log.replay(2).float()) == [0, 1, 2] and log.replay(2).dtype == torch.bfloat16
    log.release(2)
    assert log.replay(2) is None and len(log) == 0
