"""Speculation simulation and target feature capture on tiny random models."""

from dataclasses import dataclass

import torch

from draft_training.chain_sim import ChainStats, simulate_chain, teacher_forced_hits, temperature_rounds
from draft_training.target_features import TargetFeatureExtractor
from draft_training.tree_sim import simulate_tree
from tests.models.test_eagle3 import tiny_head


@dataclass(frozen=True)
class _Trace:
    tokens: torch.Tensor
    prompt_len: int
    features: torch.Tensor
    target_logits: torch.Tensor


def _trace(head, length: int = 30, prompt_len: int = 6, is_oracle: bool = False) -> _Trace:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    draft_to_target = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    tokens = draft_to_target[torch.randint(0, head.config.draft_vocab_size, (length,))]
    features = torch.randn(length, 72)
    if is_oracle:  # rewrite the continuation so it is exactly the head's own greedy chain from the prompt
        with torch.no_grad():
            cache = head.new_cache()
            fused = head.fuse(features)
            out, logits = head(tokens[1 : prompt_len + 1], fused[:prompt_len], cache)
            hidden, logits = out[-1:], logits[-1]
            for i in range(prompt_len + 1, length):
                tokens[i] = head.to_target_ids(logits.argmax())
                hidden, logits = head(tokens[i].view(1), hidden, cache)
                logits = logits[0]
    return _Trace(tokens, prompt_len, features, torch.randn(length, 96))


def test_chain_rounds_cover_the_continuation():
    head = tiny_head()
    trace = _trace(head)
    stats = ChainStats(4)
    with torch.no_grad():
        simulate_chain(head, trace, 4, stats)
    covered = stats.num_tokens
    assert len(trace.tokens) - 1 - trace.prompt_len <= covered <= len(trace.tokens) - trace.prompt_len
    assert 1.0 <= stats.summary()["mean_tokens_per_round"] <= 5.0


def test_a_draft_that_matches_the_target_accepts_everything_in_the_first_round():
    head = tiny_head()
    trace = _trace(head, is_oracle=True)
    stats = ChainStats(5)
    with torch.no_grad():
        simulate_chain(head, trace, 5, stats)
    # the continuation is the head's own chain only from the prompt end: the first round accepts all 5
    assert stats.num_accepted[5] >= 1
    tree = ChainStats(5)
    with torch.no_grad():
        simulate_tree(head, trace, budget=8, branching=2, max_depth=5, stats=tree)
    assert tree.num_accepted[1] >= 1


def test_temperature_rows_are_probabilities():
    head = tiny_head()
    with torch.no_grad():
        rows = temperature_rounds(head, _trace(head), k=3, temperature=0.7)
    assert rows.shape[1] == 3 and rows.shape[0] > 0
    assert ((rows >= 0) & (rows <= 1 + 1e-6)).all()


def test_feature_capture_is_batch_invariant(tiny_llama):
    extractor = TargetFeatureExtractor(tiny_llama, torch.float32, aux_layers=(0, 1, 2), max_batch_tokens=64)
    seqs = [list(range(2, 20)), list(range(30, 41)), list(range(5, 50))]
    together = extractor.extract(seqs)
    alone = [extractor.extract([s])[0] for s in seqs]
    for a, b, s in zip(together, alone, seqs, strict=True):
        assert a.features.shape == (len(s), 3 * 64) and a.logits.shape == (len(s), 96)
        torch.testing.assert_close(a.features, b.features, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)


def test_teacher_forced_top1_counts_the_heads_prediction_with_true_features():
    head = tiny_head()
    trace = _trace(head, length=8, prompt_len=6, is_oracle=True)  # x_7 is the head's greedy guess after the prompt
    with torch.no_grad():
        assert teacher_forced_hits(head, trace) == (1, 1)
        guess = int(trace.tokens[7])
        candidates = head.to_target_ids(torch.arange(2))  # two target ids the draft vocabulary holds
        trace.tokens[7] = candidates[0] if int(candidates[0]) != guess else candidates[1]
        assert teacher_forced_hits(head, trace) == (0, 1)
