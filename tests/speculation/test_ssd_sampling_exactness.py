"""SSD sampling is exact: with the speculation cache (hits and misses, batch > 1), neural and fast backups,
with and without Saguaro scaling, with a missing round's hits re-drafted (backup_hits), the first 3 tokens follow
the target's distribution (chi-square over 20,000 seeded runs on a 16-token vocabulary); a draft that reports q
unscaled while sampling scaled is caught."""

from collections.abc import Collection

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation import ssd_speculator
from tests.speculation.exact_distribution import chi_square_pvalue, joint_distribution
from tests.tiny_models import write_tiny_checkpoint

NUM_RUNS = 20_000
PROMPT = [3, 7, 2, 9]
TEMP = 0.9
CASES = {
    "neural-plain": SsdConfig(backup="neural"),
    "fast-saguaro": SsdConfig(backup="fast", saguaro_c=0.5),
    "neural-saguaro-uniform": SsdConfig(backup="neural", saguaro_c=0.3, fan_out="uniform", fan_out_budget=4),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("t"), tmp_path_factory.mktemp("d")
    hf = write_tiny_checkpoint(target, "llama", seed=0, vocab_size=16, initializer_range=0.3)
    write_tiny_checkpoint(draft, "llama", seed=0, vocab_size=16, num_hidden_layers=1, initializer_range=0.3)
    return target, draft, joint_distribution(hf.double(), PROMPT, TEMP)


def sample_first_tokens(setup, ssd: SsdConfig, target_sees_hits: bool = True) -> list[tuple]:
    target, draft, _ = setup
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=2, k_schedule=((1024, 2),), ssd=ssd)
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
              speculation=spec)
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True) for i in range(NUM_RUNS)]
    outs = llm.generate([PROMPT] * NUM_RUNS, params)
    counters = llm.engine.speculative_decoder.counters
    if target_sees_hits:
        assert counters.num_cache_hits > 500 and counters.num_cache_misses > 1000  # both paths well exercised
    else:  # backup_hits: the draft's lookups hit, but a round with a miss re-drafts its hits
        assert llm.engine.speculative_decoder.proposer.counters.num_hits > 500 and counters.num_cache_misses > 1000
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    return [tuple(o.token_ids) for o in outs]


@pytest.mark.parametrize("case", list(CASES))
def test_ssd_sampling_matches_target_distribution(setup, case):
    assert chi_square_pvalue(sample_first_tokens(setup, CASES[case]), setup[2]) > 0.001


def test_ssd_backup_hits_sampling_matches_target_distribution(setup):
    """backup_hits: the hits of a round that missed are re-drafted in the backup's forwards (with Saguaro scaling)."""
    samples = sample_first_tokens(setup, SsdConfig(backup="neural", backup_hits=True, saguaro_c=0.5), False)
    assert chi_square_pvalue(samples, setup[2]) > 0.001


def test_unscaled_q_with_saguaro_sampling_is_caught(setup, monkeypatch):
    """A broken draft: samples from the Saguaro-scaled q but tells the verifier the unscaled one."""
    real = ssd_speculator.sample_branch_tokens

    def broken(logits, temperature, top, c, generator):  # noqa: ANN001, ANN202
        tokens, _ = real(logits, temperature, top, c, generator)
        return tokens, torch.softmax(logits / temperature, dim=-1)

    monkeypatch.setattr(ssd_speculator, "sample_branch_tokens", broken)
    samples = sample_first_tokens(setup, SsdConfig(backup="neural", saguaro_c=0.1, fan_out_budget=4))
    assert chi_square_pvalue(samples, setup[2]) < 0.001


def test_ssd_switching_between_speculate_sd_and_plain_steps_matches_target_distribution(setup):
    """Adaptive SSD requests under a chooser that cycles all three choices step by step (an SSD round, an SD round
    that drafts afresh and builds nothing, a plain step): the tokens still follow the target."""
    from ssd.engine.mode_choice import PLAIN, SD, SPECULATE, ModeChooser

    class Cycling(ModeChooser):
        def choose(self, batch_size: int, options: tuple[str, ...] = (), lookahead: int = 0,
                   unseen: int = 0,
               seq_ids: Collection[int] | None = None) -> str:
            return options[sum(self.num_rounds.values()) % len(options)]

    target, draft, expected = setup
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=2, k_schedule=((1024, 2),),
                             ssd=SsdConfig(backup="neural"))
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=64, max_num_seqs=1024,
              speculation=spec)
    llm.engine.mode_chooser = Cycling()
    params = [SamplingParams(temperature=TEMP, max_tokens=3, seed=i, ignore_eos=True, adaptive=True)
              for i in range(NUM_RUNS)]
    samples = [tuple(o.token_ids) for o in llm.generate([PROMPT] * NUM_RUNS, params)]
    rounds = llm.engine.mode_chooser.num_rounds
    assert min(rounds[SPECULATE], rounds[SD], rounds[PLAIN]) > 0
    assert chi_square_pvalue(samples, expected) > 0.001
