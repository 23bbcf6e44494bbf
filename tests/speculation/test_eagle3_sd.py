"""SD with an EAGLE-3 head (tiny random, public key layout): greedy output equals AR, chain and tree."""

import pytest
import torch

from ssd.config import ProposerChoice, SpeculationConfig, TreeShape
from ssd.errors import CheckpointError
from ssd.llm import LLM
from ssd.loader.eagle3_checkpoint import load_eagle3_head, save_eagle3_head
from ssd.model_config import load_model_config
from ssd.models.eagle3 import Eagle3Config, Eagle3Head
from ssd.sampling.params import SamplingParams
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 14, 15, 9], [20, 21, 22], [30, 31, 32, 33, 34, 35]]
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


def write_tiny_head(folder, target_folder, draft_vocab: int = 64, seed: int = 3) -> None:
    torch.manual_seed(seed)
    tc = load_model_config(target_folder)
    config = Eagle3Config.from_target(tc, draft_vocab_size=draft_vocab, aux_layers=(0, 1, 2))
    head = Eagle3Head(config, torch.randn(tc.vocab_size, tc.hidden_size))
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "embed" not in name:
                p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
        head.d2t.copy_(torch.arange(draft_vocab) * 0 + (tc.vocab_size - draft_vocab))  # draft ids -> the top ids
        head.t2d.zero_()
        head.t2d[tc.vocab_size - draft_vocab :] = True
    save_eagle3_head(head, folder)


def tiny_target_and_head(tmp_path_factory):  # noqa: ANN001, ANN201 - shared by the EAGLE-3 test modules
    """A tiny float32 Llama target and a tiny random EAGLE-3 head for it, in fresh temp folders."""
    target, head = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("eagle3")
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_head(head, target)
    return target, head


def tiny_target_draft_and_head(tmp_path_factory):  # noqa: ANN001, ANN201 - shared by the SSD / device tests
    """A tiny float32 Llama target, a one-layer draft model and a tiny EAGLE-3 head, in fresh temp folders."""
    target, head = tiny_target_and_head(tmp_path_factory)
    draft = tmp_path_factory.mktemp("draft")
    write_tiny_checkpoint(draft, "llama", seed=1, num_hidden_layers=1)
    return target, draft, head


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


@pytest.mark.parametrize("tree", [None, TreeShape(budget=8, depth=3, top_k=2)], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_eagle3_sd_greedy_equals_ar(folders, tree, batch):
    target, head = folders
    ar = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    expected = [ar.generate([p], PARAMS)[0].token_ids for p in PROMPTS]
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3, tree=tree)
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)
    outs = [llm.generate([p], PARAMS)[0] for p in PROMPTS] if batch == 1 else llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.speculative_decoder.counters.num_drafts > 0


def test_eagle3_missing_and_misshaped_keys_are_named(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    target, head = folders
    tensors = load_file(str(head / "model.safetensors"))
    del tensors["fc.weight"]
    tensors["norm.weight"] = torch.ones(3)
    (tmp_path / "config.json").write_text((head / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing: fc.weight.*mis-shaped: norm.weight"):
        load_eagle3_head(tmp_path, torch.zeros(96, 64), torch.float32)


def test_eagle3_sd_runs_in_bfloat16(folders):
    """The head's per-sequence feature buffer follows the head's dtype (it once started as float32)."""
    target, head = folders
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3)
    llm = LLM(str(target), dtype="bfloat16", block_size=4, kv_cache_memory_mb=8, speculation=spec)
    out = llm.generate([PROMPTS[0]], PARAMS)[0]
    assert len(out.token_ids) == PARAMS.max_tokens
    assert llm.engine.speculative_decoder.counters.num_draft_tokens > 0


def test_features_with_a_gap_are_refused(folders):
    """Fused row i must hold position i's features: a request whose features start past the rows the head holds
    would shift every later row (drafting garbage, silently); it is an error naming the missing positions."""
    from ssd.errors import InvalidRequestError
    from ssd.speculation.eagle3_proposer import Eagle3Proposer
    from ssd.speculation.proposer import ProposeRequest

    target, head = folders
    tc = load_model_config(target)
    proposer = Eagle3Proposer(head, torch.randn(tc.vocab_size, tc.hidden_size), tc, "float32")
    width = 3 * tc.hidden_size

    def request(tokens: list[int], start: int, n: int) -> ProposeRequest:
        return ProposeRequest(1, tokens, 2, 0.0, torch.Generator(), None, torch.randn(n, width), start)

    proposer.propose([request(PROMPTS[0], 0, len(PROMPTS[0]) - 1)])  # positions 0..8
    with pytest.raises(InvalidRequestError, match=r"start at position 11.*0\.\.8 only"):
        proposer.propose([request(PROMPTS[0] + [1, 2, 3], 11, 1)])  # positions 9 and 10 never came
    proposer.propose([request(PROMPTS[0] + [1, 2, 3], 9, 3)])  # the contiguous continuation still drafts
