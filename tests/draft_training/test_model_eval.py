"""`ssd eval-draft` on a draft model: the teacher-forced shortcut gives the same acceptance as drafting for real."""

import torch

from draft_training.chain_sim import ChainStats
from draft_training.model_eval import chain_rounds, draft_logits
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.proposer import ProposeRequest
from tests.tiny_models import write_tiny_checkpoint, write_trimmed_draft


def test_chain_rounds_count_runs_of_hits():
    hits = torch.tensor([False, False, True, True, False, True, True, True, False])  # T = 10, P = 2
    stats = ChainStats(2)
    chain_rounds(hits, 2, 2, stats)
    # n=2: hits 2,3 -> accept 2 (n=5); n=5: hits 5,6 -> 2 (n=8); n=8: miss -> 0 (n=9, the end)
    assert stats.num_rounds == 3 and stats.num_tokens == 3 + 3 + 1


def test_teacher_forced_hits_equal_real_greedy_drafting(tmp_path):
    target, draft = tmp_path / "t", tmp_path / "d"
    write_tiny_checkpoint(target, "llama", seed=0)
    write_trimmed_draft(draft, target, [i for i in range(96) if i % 3 != 1], seed=0)
    prompt = [5, 6, 7, 8, 5, 6, 7]
    out = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8).generate(
        [prompt], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    tokens = prompt + out.token_ids
    proposer = DraftModelProposer(draft, "float32", 96, block_size=4, kv_cache_memory_mb=8)
    rows = draft_logits(proposer, tokens)  # [T, Vd]
    hits = proposer.vocab.to_target(rows[:-1].argmax(-1).tolist())
    hits = torch.tensor(hits) == torch.tensor(tokens[1:])
    assert 0 < int(hits.sum()) < len(hits)
    for n in range(len(prompt), len(tokens) - 4):
        drafted = proposer.propose([ProposeRequest(n, tokens[: n + 1], 3, 0.0, torch.Generator())])[0].tokens
        real = next((i for i, (a, b) in enumerate(zip(drafted, tokens[n + 1 :], strict=False)) if a != b), 3)
        simulated = next((i for i in range(3) if not hits[n + i]), 3)
        assert real == simulated, n
