"""SSD with an EAGLE-3 head at batch > 1: in a round where one sequence hits its speculation cache and another
misses, the neural backup consumes only the miss's new target features; the hit's reach the head in the
build. (They were once dropped: the head then drafted the hit sequence from stale features, and SSD at batch 4
accepted ~1.15 tokens per round where SD accepted ~1.6-1.9.)"""

import torch

from ssd.config import DecodeMode, SsdConfig
from ssd.model_config import ModelConfig, load_model_config
from ssd.speculation.draft_record import DraftRecord
from ssd.speculation.eagle3_branches import Eagle3BranchDrafter
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.ssd_speculator import PROBE_EVERY, SsdSpeculator
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

K = 3


def _speculator(tmp_path, config: SsdConfig) -> tuple[Eagle3Proposer, SsdSpeculator, ModelConfig]:
    """An SSD speculator over a tiny EAGLE-3 head of a tiny target, and the target's config."""
    target, head_dir = tmp_path / "target", tmp_path / "head"
    hf = write_tiny_checkpoint(target, "llama", seed=0).float().eval()
    write_tiny_head(head_dir, target)
    tc = load_model_config(target)
    proposer = Eagle3Proposer(head_dir, hf.model.embed_tokens.weight.detach(), tc, "float32")
    torch.manual_seed(0)
    return proposer, SsdSpeculator(proposer, Eagle3BranchDrafter(proposer), config), tc


def test_a_hit_beside_a_miss_keeps_its_target_features(tmp_path):
    proposer, ssd, tc = _speculator(tmp_path, SsdConfig(backup="neural", fan_out_budget=8))
    tokens = {1: [5, 6, 7, 8, 9], 2: [20, 21, 22, 23]}
    features = {i: torch.randn(len(t) - 1, 3 * tc.hidden_size) for i, t in tokens.items()}  # [P-1, 3d] each
    records = [DraftRecord(i, tokens[i], 0.0, torch.Generator(), mode=DecodeMode.SSD) for i in tokens]

    def requests(starts: dict[int, int]) -> list[ProposeRequest]:
        return [ProposeRequest(i, list(tokens[i]), K, 0.0, torch.Generator(), None, features[i][s:], s)
                for i, s in starts.items()]

    first, job = ssd.answer(requests({1: 0, 2: 0}), records)  # both miss: nothing cached yet
    ssd.build(job)
    j, bonus = next(iter(records[0].cache))  # an outcome sequence 1 has cached: it will hit
    missing = next(t for t in range(tc.vocab_size) if (0, t) not in records[1].cache and t != first[1].tokens[0])
    starts = {}
    for i, new in ((1, first[0].tokens[:j] + [bonus]), (2, [missing])):  # sequence 2 rejects s_1: a miss
        starts[i] = len(tokens[i]) - 1  # the verify's features: its root, then each accepted position
        records[i - 1].observe(RoundOutcome(i, len(tokens[i]), new, len(new) - 1))
        tokens[i] += new
        features[i] = torch.cat([features[i], torch.randn(len(new), 3 * tc.hidden_size)])
    second, job = ssd.answer(requests(starts), records)
    assert [s.cache_hit for s in second] == [True, False]
    ssd.build(job)
    with torch.no_grad():
        for i in (1, 2):
            head_features = proposer.seqs[i].fused  # [committed - 1, d]: what the head drafts from
            assert head_features.shape[0] == len(tokens[i]) - 1
            torch.testing.assert_close(head_features, proposer.head.fuse(features[i]))


def _three_sequences(tmp_path, config: SsdConfig):
    _, ssd, tc = _speculator(tmp_path, config)
    tokens = {i: [5 + i, 6, 7, 8] for i in (1, 2, 3)}
    features = {i: torch.randn(len(t) - 1, 3 * tc.hidden_size) for i, t in tokens.items()}
    records = [DraftRecord(i, tokens[i], 0.0, torch.Generator(), mode=DecodeMode.SSD) for i in tokens]
    requests = [ProposeRequest(i, list(tokens[i]), K, 0.0, torch.Generator(), None, features[i], 0) for i in tokens]
    return ssd, requests, records


def test_a_round_that_cannot_all_hit_drafts_now_and_builds_nothing(tmp_path):
    """Neural backup, 3 sequences, a measured hit rate of 0.3: all three hit with probability 0.027, under the
    floor of 0.1, so the round drafts every sequence now (as SD: no cache-hit flag) and builds no cache."""
    ssd, requests, records = _three_sequences(tmp_path, SsdConfig(backup="neural", round_hit_floor=0.1))
    ssd.hit_rate = 0.3
    specs, job = ssd.answer(requests, records)
    assert job.pending == [] and all(s.cache_hit is None and len(s.tokens) == K for s in specs)
    assert ssd.counters.num_rounds_drafted_now == 1 and ssd.counters.num_misses == 0


def test_a_round_builds_where_a_whole_hit_is_likely_enough_or_the_floor_is_off(tmp_path):
    ssd, requests, records = _three_sequences(tmp_path, SsdConfig(backup="neural", round_hit_floor=0.1))
    ssd.hit_rate = 0.5  # 0.125 >= 0.1
    _, job = ssd.answer(requests, records)
    assert len(job.pending) == 3
    ssd, requests, records = _three_sequences(tmp_path, SsdConfig(backup="neural"))  # default floor 0: always
    ssd.hit_rate = 0.01
    _, job = ssd.answer(requests, records)
    assert len(job.pending) == 3 and ssd.counters.num_rounds_drafted_now == 0


def test_rounds_that_draft_now_probe_the_cache_now_and_then(tmp_path):
    ssd, requests, records = _three_sequences(tmp_path, SsdConfig(backup="neural", round_hit_floor=0.1))
    ssd.hit_rate = 0.1
    built = [bool(ssd.answer(requests, records)[1].pending) for _ in range(PROBE_EVERY + 1)]
    assert built == [False] * PROBE_EVERY + [True]
