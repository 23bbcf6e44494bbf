"""The adaptive choice between speculating and plain decoding: it follows the measured speed, probes the other
choice now and then, and never changes the tokens (greedy output identical across switches)."""

import pytest

from ssd.config import ProposerChoice, SpeculationConfig
from ssd.engine.mode_choice import PLAIN, SPECULATE, ModeChooser, bucket_of
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.tiny_models import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_llama_and_draft(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("mode-target"), tmp_path_factory.mktemp("mode-draft")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_checkpoint(draft, "llama", seed=1, num_hidden_layers=1)
    return target, draft


def test_buckets_are_powers_of_two():
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]


def test_tries_each_then_keeps_the_faster_and_probes_the_other():
    chooser = ModeChooser(probe_every=4)
    assert chooser.choose(1) == SPECULATE
    chooser.record(1, SPECULATE, seconds=1.0, num_tokens=10)  # 10 tok/s
    assert chooser.choose(1) == PLAIN
    chooser.record(1, PLAIN, seconds=1.0, num_tokens=30)  # 30 tok/s: plain wins
    picks = []
    for _ in range(10):
        choice = chooser.choose(1)
        picks.append(choice)
        chooser.record(1, choice, seconds=1.0, num_tokens=30 if choice == PLAIN else 10)
    assert picks.count(PLAIN) >= 8 and SPECULATE in picks  # mostly plain, speculation probed
    assert picks[:4] == [PLAIN] * 4


def test_switches_back_when_speculation_becomes_faster():
    chooser = ModeChooser(probe_every=2, smoothing=1.0)
    chooser.record(1, SPECULATE, 1.0, 10)
    chooser.record(1, PLAIN, 1.0, 30)
    for _ in range(6):  # the text turns easy to draft: speculation now yields 60 tok/s
        choice = chooser.choose(1)
        chooser.record(1, choice, 1.0, 30 if choice == PLAIN else 60)
    assert chooser.choose(1) == SPECULATE
    assert chooser.num_switches >= 2
    assert chooser.summary()["adaptive_tok_s_batch1_speculate"] == 60


def test_batch_sizes_are_measured_apart():
    chooser = ModeChooser()
    chooser.record(1, SPECULATE, 1.0, 50)
    chooser.record(1, PLAIN, 1.0, 20)
    chooser.record(16, SPECULATE, 1.0, 50)
    chooser.record(16, PLAIN, 1.0, 200)
    assert (chooser.choose(1), chooser.choose(16)) == (SPECULATE, PLAIN)


class _Alternating(ModeChooser):
    """Switches every round, whatever it measures (the worst case for a switch's exactness)."""

    def choose(self, batch_size: int) -> str:
        return PLAIN if sum(self.num_rounds.values()) % 2 else SPECULATE


def test_greedy_output_identical_across_switches(tiny_llama_and_draft):
    target, draft = tiny_llama_and_draft
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    opts = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8)
    plain = LLM(str(target), **opts).generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True))
    llm = LLM(str(target), speculation=SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3), **opts)
    llm.engine.mode_chooser = _Alternating()
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True, adaptive=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    rounds = llm.engine.mode_chooser.num_rounds
    assert rounds[PLAIN] > 0 and rounds[SPECULATE] > 0 and llm.engine.mode_chooser.num_switches > 2


def test_a_request_that_names_its_mode_keeps_it(tiny_llama_and_draft):
    target, draft = tiny_llama_and_draft
    llm = LLM(str(target), speculation=SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3),
              dtype="float32", block_size=4, kv_cache_memory_mb=8)
    llm.engine.mode_chooser = _Alternating()
    fixed = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    assert sum(llm.engine.mode_chooser.num_rounds.values()) == 0  # never consulted
    assert fixed.spec is not None and fixed.spec.num_drafts > 0


def test_each_adaptive_request_reports_its_plain_and_speculated_steps(tiny_llama_and_draft):
    target, draft = tiny_llama_and_draft
    llm = LLM(str(target), speculation=SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3),
              dtype="float32", block_size=4, kv_cache_memory_mb=8)
    llm.engine.mode_chooser = _Alternating()
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=16, ignore_eos=True, adaptive=True))[0]
    rounds = llm.engine.mode_chooser.num_rounds
    assert out.spec is not None
    assert (out.spec.num_plain_steps, out.spec.num_drafts) == (rounds[PLAIN], rounds[SPECULATE])
    assert out.spec.num_plain_steps > 0 and out.spec.num_drafts > 0
