"""The adaptive choice between speculating and plain decoding: it follows the measured speed, probes the other
choice now and then, and never changes the tokens (greedy output identical across switches)."""

import pytest

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig
from ssd.engine.mode_choice import CHOICES, PLAIN, SD, SPECULATE, SPECULATE_OR_PLAIN, ModeChooser, bucket_of
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.cycling_chooser import CyclingChooser
from tests.tiny_models import write_tiny_target_and_draft


@pytest.fixture(scope="module")
def tiny_llama_and_draft(tmp_path_factory):
    return write_tiny_target_and_draft(tmp_path_factory, "mode")


def test_buckets_are_powers_of_two():
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]


def test_tries_each_then_keeps_the_faster_and_probes_the_other():
    chooser = ModeChooser(min_gap=4, explore=1.0, probe_steps=1)  # one-step probes, as often as min_gap allows
    assert chooser.choose(1) == PLAIN  # an untried bucket takes a plain step first
    chooser.record(1, PLAIN, seconds=1.0, num_tokens=30)  # 30 tok/s
    assert chooser.choose(1) == SPECULATE
    chooser.record(1, SPECULATE, seconds=1.0, num_tokens=10)  # 10 tok/s: plain wins
    picks = []
    for _ in range(10):
        choice = chooser.choose(1)
        picks.append(choice)
        chooser.record(1, choice, seconds=1.0, num_tokens=30 if choice == PLAIN else 10)
    assert picks.count(PLAIN) >= 8 and SPECULATE in picks  # mostly plain, speculation probed
    assert picks[:4] == [PLAIN] * 4


def _probes(chooser: ModeChooser, steps: int, spec_seconds: float) -> int:
    """Speculative steps in `steps` decode steps at batch 16, where plain steps yield 16 tokens in 40 ms and a
    speculative round 32 tokens in `spec_seconds`."""
    picks = []
    for _ in range(steps):
        choice = chooser.choose(16)
        picks.append(choice)
        chooser.record(16, choice, *((0.04, 16) if choice == PLAIN else (spec_seconds, 32)))
    return picks.count(SPECULATE)


def test_probes_back_off_with_what_they_cost():
    """A probe that loses little comes back every min_gap steps; one that costs five plain steps' worth of time
    comes back only when the exploration budget allows it."""
    cheap, dear = _probes(ModeChooser(), 400, spec_seconds=0.09), _probes(ModeChooser(), 400, spec_seconds=0.5)
    assert cheap >= 10  # 0.09 s for 32 tokens vs 0.08 s plain: probed about every min_gap (32) steps
    assert dear == 2  # its first try only: the switch round and one more already put it out of reach
    assert dear < cheap


def test_a_switch_steps_catch_up_is_not_taken_for_the_speed_of_speculation():
    """Batch 1: a plain step yields 1 token in 40 ms (25 tok/s); a speculative round 1.7 tokens in 60 ms (28 tok/s),
    but the first one after plain steps takes 150 ms (the draft catches up). Taking that first round for the speed of
    speculation (11 tok/s) would keep it plain; it speculates."""
    chooser, last, picks = ModeChooser(), None, []
    for _ in range(300):
        choice = chooser.choose(1, lookahead=4)
        picks.append(choice)
        if choice == PLAIN:
            chooser.record(1, PLAIN, 0.040, 1)
        else:
            chooser.record(1, SPECULATE, 0.150 if last == PLAIN else 0.060, 2 if len(picks) % 10 < 7 else 1)
        last = choice
    assert picks.count(SPECULATE) >= 250
    assert PLAIN in picks[20:]  # plain still probed


def test_a_first_try_measures_a_steady_round_before_the_next_untried_choice():
    """SSD with a remote draft at batch 1: its first round (the draft's first build, the prompt to catch up on) is
    slow, its steady rounds twice as fast as plain steps, and SD rounds slower than plain. The untried SD must not cut
    SSD's first try short after that one round (it then stood at its switch round's speed, under plain's, and was
    not tried again for ~1100 steps, docs/benchmarks.md 2026-12-07); it speculates from the first prompt on."""
    chooser, last, picks = ModeChooser(), None, []
    for _ in range(300):
        choice = chooser.choose(1, CHOICES, lookahead=4, unseen=100 if last != SPECULATE else 0)
        picks.append(choice)
        seconds, tokens = {PLAIN: (0.025, 1), SD: (0.035, 1), SPECULATE: (0.026, 2)}[choice]
        if choice == SPECULATE and last != SPECULATE:
            seconds = 0.040  # its switch round
        chooser.record(1, choice, seconds, tokens, CHOICES, unseen=100 if choice != last else 0)
        last = choice
    assert picks[1:3] == [SPECULATE, SPECULATE]  # the first try: the switch round and a steady one
    assert picks.count(SPECULATE) >= 250


def _run(chooser: ModeChooser, batch_size: int, plain: tuple[float, int], spec: tuple[float, int],
         catch_up_s: float, steps: int = 1500, behind: int = 0, tell: bool = True, fed_until_first: bool = False) -> int:
    """`steps` decode steps at `batch_size`: a plain step takes plain = (seconds, tokens), a speculative round spec
    plus `catch_up_s` for each token its drafts are behind (`behind` at the start; each plain step adds `batch_size`,
    none before the first round where `fed_until_first`), which the chooser is told where `tell`. Returns the
    speculative rounds taken."""
    rounds = 0
    for _ in range(steps):
        unseen = behind if tell else 0
        choice = chooser.choose(batch_size, lookahead=4, unseen=unseen)
        if choice == PLAIN:
            (seconds, tokens), behind = plain, behind + (0 if fed_until_first and not rounds else batch_size)
        else:
            seconds, tokens, behind, rounds = spec[0] + catch_up_s * behind, spec[1], 0, rounds + 1
        chooser.record(batch_size, choice, seconds, tokens, unseen=unseen)
    return rounds


def _batch16_run(chooser: ModeChooser, tell: bool = True, fed_until_first: bool = False) -> int:
    """A plain step yields 16 tokens in 40 ms; a speculative round 26 in 150 ms, plus 0.2 ms a skipped token."""
    return _run(chooser, 16, (0.040, 16), (0.150, 26), 0.0002, tell=tell, fed_until_first=fed_until_first)


def test_a_probe_waits_for_what_its_drafts_catch_up_will_cost():
    """The longer speculation sits out, the more its draft has to catch up on: the chooser learns the cost per
    skipped token from the switch steps and probes only when the budget covers the catch-up too."""
    told = ModeChooser()
    assert _batch16_run(told) == 2  # the first try only (its switch round and one more)
    cost = told.buckets[(16, (SPECULATE, PLAIN))].switch_costs[SPECULATE]  # one switch, no prefill: all per token
    assert (cost.fixed_s, cost.per_token_s) == pytest.approx((0.0, 0.0002))
    assert _batch16_run(ModeChooser(), tell=False) > 2  # blind to the catch-up: it probes on


def test_a_catch_up_learned_at_one_batch_size_prices_the_probes_of_another():
    """Until batch 16 has measured a switch of its own (its first round had nothing to catch up on), the catch-up
    learned at batch 1 prices its probes."""
    taught = ModeChooser()
    taught.record(1, PLAIN, 0.040, 1)
    taught.record(1, SPECULATE, 0.060 + 0.0002 * 300, 2, unseen=300)  # the switch: 300 skipped tokens
    taught.record(1, SPECULATE, 0.060, 2)  # a steady round
    assert taught.buckets[(1, (SPECULATE, PLAIN))].switch_costs[SPECULATE].per_token_s == pytest.approx(0.0002)
    assert _batch16_run(taught, fed_until_first=True) == 2  # its first try (a switch round and one more) only
    assert _batch16_run(ModeChooser(), fed_until_first=True) > 2  # nothing learned anywhere: it probes on


def test_before_any_switch_was_measured_the_targets_cost_per_token_prices_the_catch_up():
    """No switch measured yet: the first probe of a bucket that started from a prediction is priced at what one more
    token adds to the target's forward (1 ms here), so drafts 1600+ tokens behind are not caught up for a probe the
    budget cannot pay for. Drafts kept fed are probed."""
    def predicted_bucket_rounds(behind: int, catch_up_s: float) -> int:
        return _run(_chooser_that_measured_batch_1(), 16, (0.040, 16), (0.2, 32), catch_up_s, steps=1000,
                    behind=behind, tell=catch_up_s > 0)

    assert predicted_bucket_rounds(behind=1600, catch_up_s=0.001) == 0
    assert predicted_bucket_rounds(behind=0, catch_up_s=0.0) > 0


def test_a_choice_within_reach_still_waits_until_the_budget_pays_its_drafts_catch_up():
    """Batch 4: plain steps make 100 tok/s, speculation 87.5 (7 tokens in 80 ms), close enough after two rounds to be
    within reach; but its draft catches up at 5 ms a skipped token, 20 ms more per plain step it sits out, against
    1.2 ms of budget a step: no probe after its first try. Where switching back is free, it is probed on."""
    def rounds(catch_up_s: float) -> int:
        return _run(ModeChooser(), 4, (0.040, 4), (0.080, 7), catch_up_s, steps=1000)

    assert rounds(catch_up_s=0.005) == 4  # its first try, a probe's 4 steps (within reach), and no probe after
    assert rounds(catch_up_s=0.0) > 10  # within reach and free to switch to: back every min_gap steps


def test_a_short_switchs_excess_is_a_fixed_cost_not_a_cost_per_token():
    """SSD at batch 1 on Sapphire Rapids (docs/benchmarks.md 2026-12-07): plain steps 1 token in 25 ms, SD rounds 1.2
    in 35 ms, SSD rounds 2 in 26 ms; a switch to SSD costs 7.5 ms (a round with no cache) plus 0.1 ms per token its
    draft has not seen, and the target's prefill takes 0.4 ms a token. Its switches back from SD probes catch up on
    1-2 tokens: read per token, their 7.5 ms priced the way back from a streak of plain steps at 7.5 ms per step
    sat out, more than the probe budget ever pays. Through a hard passage (SSD rounds of 1 token, 4% under plain's
    speed) it keeps SSD, whose round at its worst is that close to a plain step (ModeChooser.downside)."""
    chooser, last, unseen, picks = ModeChooser(), None, 100, []
    chooser.forward_cost.record_prefill(100, 0.040)
    for step in range(600):
        choice = chooser.choose(1, CHOICES, lookahead=4, unseen=unseen)
        picks.append(choice)
        hard = 150 <= step < 250
        seconds, tokens = {PLAIN: (0.025, 1), SD: (0.035, 1 + (step % 5 == 0)), SPECULATE: (0.026, 1 + (not hard))}[
            choice]
        if choice != PLAIN and choice != last:
            seconds += 0.0001 * unseen + (0.0075 if choice == SPECULATE else 0.0)
        chooser.record(1, choice, seconds, tokens, CHOICES, unseen=unseen)
        unseen = unseen + tokens if choice == PLAIN else tokens
        last = choice
    assert picks[150:250].count(SPECULATE) >= 90 and picks[350:].count(SPECULATE) >= 200
    to_ssd, to_sd = (chooser.buckets[(1, CHOICES)].switch_costs[c] for c in (SPECULATE, SD))
    assert to_ssd.fixed_s == pytest.approx(0.0075, abs=0.001) and to_ssd.per_token_s < 0.0004
    assert to_sd.fixed_s < 0.001


def test_sd_and_ssd_rounds_are_weighed_on_the_same_yield():
    """The text alternates between hard passages (1.25 tokens a speculative round) and easy ones (2.33). SD and SSD
    rounds yield the same; an SD round takes 33 ms, an SSD round 24.5 ms, so SD is never the faster. Measured apart,
    SD's probes on easy text beat SSD's rounds on the hard text before them, and SD took over until SSD's were aged
    out (199 SD rounds in 1200 steps); on one yield SD is only probed."""
    chooser, picks = ModeChooser(), []
    for step in range(1200):
        choice = chooser.choose(1, CHOICES, lookahead=4, unseen=2)
        picks.append(choice)
        easy = (step // 150) % 2 == 1
        spec_tokens = 2 + (step % 3 == 0) if easy else 1 + (step % 4 == 0)
        seconds, tokens = {PLAIN: (0.019, 1), SD: (0.033, spec_tokens), SPECULATE: (0.0245, spec_tokens)}[choice]
        chooser.record(1, choice, seconds, tokens, CHOICES, unseen=2)
    assert picks.count(SD) <= 60 and picks.count(SPECULATE) >= 650


def test_an_ssd_draft_that_catches_up_during_the_verify_settles_over_two_rounds():
    """SSD at batch 4 (docs/benchmarks.md 2026-12-07): plain steps 4 tokens in 24 ms (167 tok/s), steady SSD rounds 6
    in 30 ms (200 tok/s), SD rounds 6 in 58 ms. A switch to SSD answers at once from the backup while the draft
    catches up on the tokens it skipped (0.1 ms each, 448 at first) during the verify, so the second round waits for
    it. Taking that round for SSD's speed (85 tok/s) kept the bucket plain; SSD takes over."""
    chooser, last, unseen, picks, waiting = ModeChooser(), None, 448, [], 0.0
    for _ in range(600):
        choice = chooser.choose(4, CHOICES, lookahead=4, unseen=unseen)
        picks.append(choice)
        seconds, tokens = {PLAIN: (0.024, 4), SD: (0.058, 6), SPECULATE: (0.030 + waiting, 6)}[choice]
        waiting = 0.0
        if choice == SPECULATE and last != SPECULATE:
            seconds, tokens, waiting = 0.026, 4, 0.0001 * unseen
        chooser.record(4, choice, seconds, tokens, CHOICES, unseen=unseen)
        unseen = unseen + tokens if choice == PLAIN else tokens
        last = choice
    assert picks.count(SPECULATE) >= 450


def test_a_batchs_yield_follows_the_text_within_as_many_sequence_steps_as_batch_1():
    """Batch 4: 300 steps of hard text (5.25 tokens a round in 36 ms, 146 tok/s, under plain's 156), then easy text
    (7 tokens, 194 tok/s). A round of 4 sequences averages 4 yields, so its window counts 16 rounds, not 64 (as many
    sequence-steps as batch 1's), and the old text ages out 4 times sooner: speculation takes over sooner (183 of
    the 250 easy steps with the window of batch 1)."""
    chooser, picks = ModeChooser(), []
    for step in range(550):
        choice = chooser.choose(4, lookahead=4)
        picks.append(choice)
        tokens = [6, 7, 7, 8][step % 4] if step >= 300 else [4, 5, 6, 6][step % 4]
        chooser.record(4, choice, *((4 / 156, 4) if choice == PLAIN else (0.036, tokens)))
    assert picks[:300].count(SPECULATE) < 50 and picks[300:].count(SPECULATE) >= 200


def test_a_draining_batch_is_weighed_per_sequence():
    """Bucket 16 holds batches of 9 to 16 sequences: here 100 steps of 16, then 60 of 10 as requests finish, over and
    over. Plain steps commit a token per sequence in 33 ms (485 tok/s at 16); speculative rounds 1.7 per sequence in
    58 ms (469 tok/s at 16), never the faster. Counting each step's tokens as they came, plain steps measured while
    the batch drained lost to rounds measured while it was full (667 rounds of 1600); per sequence, it is probed."""
    chooser, picks = ModeChooser(), []
    for step in range(1600):
        batch = 16 if step % 160 < 100 else 10
        choice = chooser.choose(batch, lookahead=4)
        picks.append(choice)
        chooser.record(batch, choice, *((0.033, batch) if choice == PLAIN else (0.058, round(1.7 * batch))))
    assert picks.count(SPECULATE) <= 300


def test_speculation_that_turns_faster_takes_over_again():
    chooser = ModeChooser(min_gap=2)
    chooser.record(1, PLAIN, 1.0, 30)
    chooser.record(1, SPECULATE, 1.0, 28)  # a little slower: probed again after a few steps
    for _ in range(8):  # the text turns easy to draft: speculation now yields 60 tok/s
        choice = chooser.choose(1)
        chooser.record(1, choice, 1.0, 30 if choice == PLAIN else 60)
    assert chooser.choose(1) == SPECULATE
    assert chooser.num_rounds[SPECULATE] >= 5  # it took over after its probe


def test_switches_back_when_speculation_becomes_faster():
    chooser = ModeChooser(min_gap=2, explore=0.2, probe_steps=1, window=1, token_window=1)
    chooser.record(1, SPECULATE, 1.0, 10)
    chooser.record(1, PLAIN, 1.0, 30)
    picks = []
    for _ in range(16):  # the text turns easy to draft: speculation now yields 60 tok/s
        choice = chooser.choose(1)
        picks.append(choice)
        chooser.record(1, choice, 1.0, 30 if choice == PLAIN else 60)
    assert picks[-6:].count(SPECULATE) >= 4  # speculating again, plain only probed
    assert chooser.num_switches >= 2
    assert chooser.summary()["adaptive_tok_s_batch1_speculate"] == 60


def test_batch_sizes_are_measured_apart():
    chooser = ModeChooser(probe_steps=1)
    chooser.record(1, SPECULATE, 1.0, 50)
    chooser.record(1, PLAIN, 1.0, 20)
    chooser.record(16, SPECULATE, 1.0, 50)
    chooser.record(16, PLAIN, 1.0, 200)
    assert (chooser.choose(1), chooser.choose(16)) == (SPECULATE, PLAIN)


def _chooser_that_measured_batch_1() -> ModeChooser:
    """Speculation at batch 1 yields 2 tokens per round; decode-shaped forwards of 1 and 5 tokens took 20 and 24 ms
    (1 ms a token: a verify of 16 x 5 tokens predicted at 20 + 79 x 1 = 99 ms)."""
    chooser = ModeChooser()
    chooser.record(1, PLAIN, 0.030, 1)
    chooser.record(1, SPECULATE, 0.040, 2)
    chooser.forward_cost.record(1, 0.020)
    chooser.forward_cost.record(5, 0.024)
    return chooser


def test_an_untried_bucket_where_even_a_free_draft_loses_starts_from_the_prediction():
    chooser = _chooser_that_measured_batch_1()
    assert chooser.choose(16, lookahead=4) == PLAIN
    chooser.record(16, PLAIN, 0.040, 16)  # 400 tok/s; speculation: 16 x 2 tokens per 99 ms = 323 at best
    assert chooser.choose(16, lookahead=4) == PLAIN  # no speculative round paid to learn that
    assert chooser.num_predicted == 1
    assert chooser.summary()["adaptive_tok_s_batch16_speculate"] == pytest.approx(16 * 2 / 0.099, rel=1e-3)
    picks = [chooser.choose(16, lookahead=4) for _ in range(1)]
    for _ in range(200):  # it is probed for real in time, and then measured
        choice = chooser.choose(16, lookahead=4)
        picks.append(choice)
        chooser.record(16, choice, *((0.04, 16) if choice == PLAIN else (0.2, 32)))
    assert SPECULATE in picks and chooser.buckets[(16, (SPECULATE, PLAIN))].speeds[SPECULATE].seconds


def test_an_untried_bucket_where_a_free_draft_could_win_tries_speculation():
    chooser = _chooser_that_measured_batch_1()
    chooser.record(16, PLAIN, 0.080, 16)  # 200 tok/s: speculation might reach 323
    assert chooser.choose(16, lookahead=4) == SPECULATE
    assert chooser.num_predicted == 0


def test_an_untried_bucket_whose_prediction_loses_by_less_than_the_lines_error_tries_speculation():
    """The line through 1- and 5-token forwards can overprice a larger verify (AMX: flat to 16 rows); a prediction
    8% under plain's speed is within that, so speculation is tried rather than left for a probe."""
    chooser = _chooser_that_measured_batch_1()
    chooser.record(16, PLAIN, 16 / 350, 16)  # 350 tok/s; speculation predicted at 323
    assert chooser.choose(16, lookahead=4) == SPECULATE
    assert chooser.num_predicted == 0


def test_ssd_batches_also_weigh_speculating_as_plain_sd():
    chooser = ModeChooser(min_gap=4, explore=0.1, probe_steps=1)
    assert chooser.choose(1, CHOICES) == PLAIN
    chooser.record(1, PLAIN, 1.0, 20, CHOICES)
    assert chooser.choose(1, CHOICES) == SPECULATE
    chooser.record(1, SPECULATE, 1.0, 30, CHOICES)
    assert chooser.choose(1, CHOICES) == SD
    chooser.record(1, SD, 1.0, 40, CHOICES)  # the overlap's build slows the verify more than its hits save
    picks = []
    for _ in range(16):
        choice = chooser.choose(1, CHOICES)
        picks.append(choice)
        chooser.record(1, choice, 1.0, {PLAIN: 20, SPECULATE: 30, SD: 40}[choice], CHOICES)
    assert picks.count(SD) >= 10 and SPECULATE in picks and PLAIN in picks  # both others probed
    assert chooser.summary()["adaptive_sd_rounds"] == 1 + picks.count(SD)


def test_greedy_output_identical_across_switches(tiny_llama_and_draft):
    target, draft = tiny_llama_and_draft
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    opts = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8)
    plain = LLM(str(target), **opts).generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    llm = LLM(str(target), speculation=SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3), **opts)
    llm.engine.mode_chooser = CyclingChooser()
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True, adaptive=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    rounds = llm.engine.mode_chooser.num_rounds
    assert rounds[PLAIN] > 0 and rounds[SPECULATE] > 0 and llm.engine.mode_chooser.num_switches > 2


def test_a_request_that_names_its_mode_keeps_it(tiny_llama_and_draft):
    target, draft = tiny_llama_and_draft
    llm = LLM(str(target), speculation=SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3),
              dtype="float32", block_size=4, kv_cache_memory_mb=8)
    llm.engine.mode_chooser = CyclingChooser()
    fixed = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    assert sum(llm.engine.mode_chooser.num_rounds.values()) == 0  # never consulted
    assert fixed.spec is not None and fixed.spec.num_drafts > 0


def test_each_adaptive_request_reports_its_plain_and_speculated_steps(tiny_llama_and_draft):
    target, draft = tiny_llama_and_draft
    llm = LLM(str(target), speculation=SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3),
              dtype="float32", block_size=4, kv_cache_memory_mb=8)
    llm.engine.mode_chooser = CyclingChooser()
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=16, ignore_eos=True, adaptive=True))[0]
    rounds = llm.engine.mode_chooser.num_rounds
    assert out.spec is not None
    assert (out.spec.num_plain_steps, out.spec.num_drafts) == (rounds[PLAIN], rounds[SPECULATE])
    assert out.spec.num_plain_steps > 0 and out.spec.num_drafts > 0


def test_ssd_greedy_output_identical_across_speculate_sd_and_plain_steps(tiny_llama_and_draft):
    """In-process SSD under a chooser that cycles all three choices: an SD round drafts afresh and builds nothing,
    the SSD round after it misses its empty cache; the tokens are plain greedy's."""
    target, draft = tiny_llama_and_draft
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    opts = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8)
    plain = LLM(str(target), **opts).generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3, ssd=SsdConfig())
    llm = LLM(str(target), speculation=spec, **opts)
    llm.engine.mode_chooser = CyclingChooser()
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True, adaptive=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    rounds = llm.engine.mode_chooser.num_rounds
    assert min(rounds[SPECULATE], rounds[SD], rounds[PLAIN]) > 0
    draft_side = llm.engine.speculative_decoder.proposer.counters
    target_side = llm.engine.speculative_decoder.counters
    assert 0 < draft_side.num_builds <= rounds[SPECULATE]  # SD rounds build nothing
    assert draft_side.num_hits + draft_side.num_misses == target_side.num_cache_lookups  # SD rounds: no lookups
    assert target_side.num_drafts > target_side.num_cache_lookups
    assert all(0 < o.spec.num_sd_rounds < o.spec.num_drafts for o in outs)  # each request counts its SD rounds


def test_an_ssd_switchs_backup_rounds_are_not_its_yield():
    """Batch 1: plain steps 1 token in 25 ms (40 tok/s); SSD rounds 2.5 tokens in 50 ms (50 tok/s), but the two
    rounds after a switch answer from the backup and bring 1 token each. Counted as SSD's yield, every probe's
    backup rounds made SSD look slower than plain (1.75 tokens a round over a 4-round probe, 35 tok/s) and it stayed
    plain; they belong to the switch: it speculates."""
    chooser, last, run, picks = ModeChooser(), None, 0, []
    for _ in range(400):
        choice = chooser.choose(1, CHOICES, lookahead=4)
        picks.append(choice)
        run = run + 1 if choice == last else 1
        drafted = 2 + len(picks) % 2  # 2 or 3 tokens: 2.5 a round
        seconds, tokens = {PLAIN: (0.025, 1), SD: (0.060, drafted), SPECULATE: (0.050, 1 if run <= 2 else drafted)}[
            choice]
        chooser.record(1, choice, seconds, tokens, CHOICES)
        last = choice
    assert picks[-300:].count(SPECULATE) >= 250


def test_a_switch_whose_draft_kept_up_is_learned_as_a_fixed_cost():
    """A draft fed during the plain steps has nothing to catch up on at a switch (unseen 0); the switch still costs
    its round with no cache, which the chooser learns as the fixed part."""
    chooser = ModeChooser()
    chooser.record(1, PLAIN, 0.025, 1, CHOICES)
    for seconds in (0.040, 0.035, 0.026, 0.026):  # two settling rounds, then steady ones
        chooser.record(1, SPECULATE, seconds, 2, CHOICES, unseen=0)
    cost = chooser.buckets[(1, CHOICES)].switch_costs[SPECULATE]
    assert cost.fixed_s == pytest.approx(0.014 + 0.009) and cost.per_token_s == 0.0


def _text_change(seq_ids: bool, first_easy: bool = True) -> list[str]:
    """Batch 1, one request after another: 100 steps of text the draft follows (3 tokens a round in 30 ms, 100 tok/s,
    against plain's 40; or, not `first_easy`, text it cannot), 150 steps of text it cannot follow (1 token a round,
    33 tok/s), then a new request whose text it follows. Each request's first two rounds bring 1 token. The picks of
    the third request's first 100 steps, the chooser told the batch's sequences or not."""
    chooser, picks, rounds = ModeChooser(), [], {}
    for step in range(350):
        seq = 0 if step < 100 else 1 if step < 250 else 2
        easy = seq == 2 or (seq == 0 and first_easy)
        choice = chooser.choose(1, lookahead=4, seq_ids=[seq] if seq_ids else None)
        if seq == 2:
            picks.append(choice)
        rounds[seq] = rounds.get(seq, 0) + (choice != PLAIN)
        tokens = 3 if easy and rounds[seq] > 2 else 1
        chooser.record(1, choice, *((0.025, 1) if choice == PLAIN else (0.030, tokens)))
    return picks


def test_a_new_request_has_its_speculation_measured_at_once():
    """Where plain steps lead but speculation at its yield over all texts so far would not, new text is probed on its
    first step instead of when the exploration budget allows, and its own rounds replace the old text's yield once
    there are enough of them. Where speculation never beat plain steps on any text, new text waits for the budget."""
    told, blind = _text_change(seq_ids=True), _text_change(seq_ids=False)
    assert told[0] == SPECULATE and told.count(SPECULATE) >= 90
    assert blind[0] == PLAIN and blind.count(SPECULATE) < told.count(SPECULATE)
    assert _text_change(seq_ids=True, first_easy=False)[0] == PLAIN


def test_a_new_texts_first_rounds_settle_and_then_its_own_rounds_are_its_yield():
    """Speculation leads; a new request's first round (its draft's prefill; an SSD draft's two: nothing cached) is not
    its yield, and the previous request's rounds leave it: it starts from two rounds at the yield of all texts."""
    chooser = ModeChooser()
    for _ in range(60):
        choice = chooser.choose(1, lookahead=4, seq_ids=[1])
        chooser.record(1, choice, *((0.025, 1) if choice == PLAIN else (0.030, 4)))
    rounds = 0  # of the new request
    for _ in range(30):
        choice = chooser.choose(1, lookahead=4, seq_ids=[2])
        rounds += choice == SPECULATE
        tokens = 1 if choice == PLAIN or rounds <= 1 else 2  # SD's options: a switch (and new text) settles in 1
        chooser.record(1, choice, 0.030 if choice == SPECULATE else 0.025, tokens)
    assert rounds >= 25
    typical, counted = 4.0, rounds - 1  # the first text's yield; the new text's rounds but its first
    expected = (ModeChooser.prior_steps * typical + 2.0 * counted) / (ModeChooser.prior_steps + counted)
    assert chooser.buckets[(1, SPECULATE_OR_PLAIN)].speeds[SPECULATE].mean_tokens == pytest.approx(expected)


def test_a_large_batchs_new_sequences_keep_its_yield():
    """Batch 16's yield averages 16 texts: a new batch of sequences keeps the speed measured on the last."""
    chooser = ModeChooser()
    for step in range(40):  # easier text first: its rounds are in the yield of all texts, not in the last rounds'
        choice = chooser.choose(16, lookahead=4, seq_ids=range(16))
        chooser.record(16, choice, *((0.040, 16) if choice == PLAIN else (0.050, 40 if step < 20 else 24)))
    before = chooser.buckets[(16, SPECULATE_OR_PLAIN)].speeds[SPECULATE].mean_tokens
    chooser.choose(16, lookahead=4, seq_ids=range(16, 32))
    assert chooser.buckets[(16, SPECULATE_OR_PLAIN)].speeds[SPECULATE].mean_tokens == before


def _alternating_text(chooser: ModeChooser, steps: int = 3000, stretch: int = 150) -> tuple[float, int]:
    """Batch 1: a plain step yields a token in 25 ms (40 tok/s), a speculative round costs 27.5 ms (at its worst, one
    token, 9% slower than plain). The text alternates every `stretch` steps between hard (a round yields 1.05 tokens:
    38 tok/s, plain is faster) and easy (2 tokens: 73 tok/s). Returns (tok/s over the run, plain steps on easy text)."""
    seconds = tokens = 0.0
    plain_on_easy = rounds = 0
    for step in range(steps):
        hard = (step // stretch) % 2 == 0
        choice = chooser.choose(1, lookahead=4)
        if choice == PLAIN:
            took, got = 0.025, 1
            plain_on_easy += not hard
        else:
            took, got = 0.0275, ([1] * 19 + [2] if hard else [2, 3, 1, 2])[rounds % (20 if hard else 4)]
            rounds += 1
        chooser.record(1, choice, took, got)
        seconds, tokens = seconds + took, tokens + got
    return tokens / seconds, plain_on_easy


def test_speculation_that_costs_little_at_its_worst_keeps_running_through_hard_text():
    """Where a round costs little more than a plain step, speculation gives way to plain steps only once its yield
    clearly cannot match them: on hard text it loses at most 9% (one token a round), while plain steps on text that
    turned easy again lose ~45% until a probe finds it. Weighed like any choice (downside 0), the chooser left for
    plain steps on each hard stretch and stayed on them into the easy text."""
    kept, plain_on_easy = _alternating_text(ModeChooser())
    weighed, weighed_plain_on_easy = _alternating_text(ModeChooser(downside=0.0))
    assert plain_on_easy < 150 < 2 * 150 < weighed_plain_on_easy  # under one stretch's worth in 1500 easy steps
    assert kept > weighed


def _steady_picks(chooser: ModeChooser, batch: int, plain: tuple[float, int], spec: tuple[float, int],
                  steps: int = 1000, first_plain_s: float | None = None) -> list[str]:
    picks = []
    for _ in range(steps):
        choice = chooser.choose(batch, lookahead=4)
        seconds, tokens = plain if choice == PLAIN else spec
        if choice == PLAIN and not picks and first_plain_s is not None:
            seconds = first_plain_s  # the bucket's first step, right after a prefill
        picks.append(choice)
        chooser.record(batch, choice, seconds, tokens)
    return picks


def test_plain_steps_are_not_probed_while_cheap_speculation_leads():
    """Batch 1: a round of 2 tokens costs 27.5 ms, a plain step 25 ms: speculation leads, and at its worst (one
    token) it is 9% under plain's speed, so once plain steps are measured over a few steady steps they are not probed
    (their yield is exact; their last speed is the bar should speculation's yield fall). Batch 16, a round costs 2.7x
    a plain step: plain steps are probed, and win, even where the bucket's first plain step took 2.4x a later one
    (measured alone, it made the round look cheap)."""
    cheap = _steady_picks(ModeChooser(), 1, (0.025, 1), (0.0275, 2))
    assert cheap.count(PLAIN) <= 8 and cheap[200:].count(PLAIN) == 0
    dear = _steady_picks(ModeChooser(), 16, (0.037, 16), (0.100, 32), first_plain_s=0.087)
    assert dear[100:].count(PLAIN) > 800


def test_sd_rounds_slower_than_ssds_are_not_probed():
    """SSD at batch 1 on Sapphire Rapids (docs/benchmarks.md 2026-12-07): plain steps 1 token in 25 ms, SSD rounds in
    27.5 ms, SD rounds (the draft's K steps on the round's path) in 39 ms, the text alternating between hard (1.1
    tokens a round) and easy (2). SD and SSD rounds share one yield, so SD, 40% slower a round, loses to SSD whatever
    the text: once both are measured it is not probed (each probe cost 2-4 rounds at 0.7x SSD's speed)."""
    chooser, picks = ModeChooser(), []
    for step in range(1500):
        choice = chooser.choose(1, CHOICES, lookahead=4, unseen=1)
        picks.append(choice)
        easy = (step // 150) % 2 == 1
        spec_tokens = 2 if easy else 1 + (step % 10 == 0)
        seconds, tokens = {PLAIN: (0.025, 1), SD: (0.039, spec_tokens), SPECULATE: (0.0275, spec_tokens)}[choice]
        chooser.record(1, choice, seconds, tokens, CHOICES, unseen=1)
    assert picks.count(SD) <= 4  # its first try
    assert picks[300:].count(SPECULATE) >= 600


def test_plain_steps_taken_beside_a_prefilling_draft_count_but_are_not_timed():
    """While the draft prefills new prompts the engine takes plain steps (`wait_for_draft`), slowed by that prefill
    on the next core: they count as plain steps, but plain's time comes from the steps after them (a bucket whose
    only plain steps were such is still untried: its first choice is a measured plain step)."""
    chooser = ModeChooser()
    for _ in range(3):
        chooser.record(16, chooser.wait_for_draft(), 0.060, 16, measured=False)
    assert PLAIN not in chooser.buckets[(bucket_of(16), SPECULATE_OR_PLAIN)].speeds  # still untried: no stand-in
    assert chooser.choose(16, lookahead=4) == PLAIN
    for _ in range(2):
        chooser.record(16, PLAIN, 0.030, 16)
    plain = chooser.buckets[(bucket_of(16), SPECULATE_OR_PLAIN)].speeds[PLAIN]
    assert chooser.num_rounds[PLAIN] == 5 and chooser.num_draft_waits == 3
    assert plain.step_s == pytest.approx(0.030) and plain.tok_s == pytest.approx(16 / 0.030)
