"""`ssd train-draft --max-total-minutes`: the training cap leaves room for the data stage and saving."""

import pytest

from draft_training.cli import TRAIN_OVERHEAD_MINUTES, _train_minutes
from ssd.errors import InvalidRequestError


def test_no_total_budget_keeps_the_training_cap() -> None:
    assert _train_minutes(None, None, 1200) is None
    assert _train_minutes(30.0, None, 1200) == 30.0


def test_total_budget_subtracts_data_time_and_overhead() -> None:
    assert _train_minutes(None, 90.0, 30 * 60) == pytest.approx(60.0 - TRAIN_OVERHEAD_MINUTES)
    assert _train_minutes(20.0, 90.0, 30 * 60) == 20.0  # the tighter of the two wins


def test_budget_already_spent_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match="leaves no time to train"):
        _train_minutes(None, 30.0, 29 * 60)
