"""SpecStats: the derived ratios (None before anything is counted) and the difference of two snapshots."""

from ssd.speculation.speculation_stats import SpecStats


def test_ratios_are_none_until_counted():
    s = SpecStats()
    assert (s.accept_rate, s.tokens_per_round, s.cache_hit_rate, s.verify_ms_per_round) == (None, None, None, None)
    s.record(4, 2, 3, cache_hit=True, predicted_hit=0.5)
    s.record(4, 0, 1, cache_hit=False)
    s.record_round_time(0.001, 0.003)
    assert (s.accept_rate, s.tokens_per_round) == (0.25, 2.0)
    assert (s.num_cache_lookups, s.cache_hit_rate, s.tokens_per_round_hit, s.tokens_per_round_miss) == (2, 0.5, 3, 1)
    assert s.predicted_hit_rate == 0.5
    assert (s.propose_ms_per_round, s.verify_ms_per_round) == (1.0, 3.0)
    assert s.accepted_per_position == [1, 1]


def test_since_counts_only_what_came_after_the_snapshot():
    s = SpecStats()
    s.record(3, 1, 2)
    before = s.snapshot()
    s.record(3, 3, 4)
    delta = s.since(before)
    assert (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens, delta.num_emitted_tokens) == (1, 3, 3, 4)
    assert delta.accepted_per_position == [1, 1, 1]
    assert before.accepted_per_position == [1]  # the snapshot is its own copy
