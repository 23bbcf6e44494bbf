"""SSD tree decode equals a dense per-branch reference (float32 logits within 1e-4), for several fan-out
shapes including non-uniform ones: the paged draft-model drafter against HF forwards of each branch's full
sequence, and the EAGLE-3 drafter against the head run step by step on each branch alone (in its trimmed vocabulary)."""

import pytest
import torch

from ssd.model_config import load_model_config
from ssd.speculation.branch_drafter import BranchRequest, GlueRequest
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.eagle3_branches import Eagle3BranchDrafter
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.paged_branches import PagedBranchDrafter
from ssd.speculation.proposer import ProposeRequest
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

COMMITTED = [5, 6, 7, 8, 9, 10, 11, 40, 41, 42, 43]  # the last token is the bonus
SPEC = [12, 13, 14]  # m = 3
DEPTH = 3
SHAPES = {  # fork points j per branch (F_j = how often j repeats)
    "uniform": [0, 0, 1, 1, 2, 2, 3, 3],
    "geometric": [0, 0, 0, 1, 1, 2, 3],
    "only-j0": [0, 0, 0, 0],
    "single": [2],
}


def _guesses(fork_points: list[int]) -> list[int]:
    return [50 + 3 * i for i in range(len(fork_points))]  # distinct tokens, none equal to s_{j+1}


def _run(drafter, glue_request: GlueRequest, fork_points: list[int]):
    glue = drafter.glue([glue_request])[0]  # [m+1, Vd]: the drafter's vocabulary
    seen: list[torch.Tensor] = []

    def pick(d, logits):  # noqa: ANN001, ANN202 - one request: logits [M, Vd]
        seen.append(logits[0].clone())
        return [drafter.vocab.to_target(logits[0].argmax(dim=-1).tolist())]

    req = BranchRequest(glue_request.seq_id, len(COMMITTED), len(SPEC) + 1, fork_points, _guesses(fork_points))
    tokens = drafter.decode_branches([req], DEPTH, pick)[0]  # [M, DEPTH]
    return glue, seen, tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = tmp_path_factory.mktemp("target")
    hf = write_tiny_checkpoint(target, "llama", seed=0).float().eval()
    return target, hf


@pytest.mark.parametrize("shape", list(SHAPES))
def test_paged_tree_decode_equals_dense_reference(tiny, shape):
    target, hf = tiny
    proposer = DraftModelProposer(target, "float32", load_model_config(target).vocab_size, block_size=4,
                                  kv_cache_memory_mb=8)
    drafter = PagedBranchDrafter(proposer)
    fork_points = SHAPES[shape]
    glue, seen, tokens = _run(drafter, GlueRequest(1, COMMITTED, SPEC, reserve=DEPTH * len(fork_points)), fork_points)
    with torch.no_grad():
        full = hf(torch.tensor([COMMITTED + SPEC])).logits[0].float()  # [n, V]
        assert torch.allclose(glue, full[len(COMMITTED) - 1 :], atol=1e-4)
        for r, (j, g) in enumerate(zip(fork_points, _guesses(fork_points), strict=True)):
            path = COMMITTED + SPEC[:j] + [g]
            for d in range(DEPTH):
                ref = hf(torch.tensor([path])).logits[0, -1].float()
                assert torch.allclose(seen[d][r], ref, atol=1e-4), (shape, r, d)
                path = path + [int(tokens[r, d])]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_eagle3_tree_decode_equals_sequential_reference(tiny, tmp_path, shape):
    target, hf = tiny
    write_tiny_head(tmp_path, target)
    tc = load_model_config(target)
    proposer = Eagle3Proposer(tmp_path, hf.model.embed_tokens.weight.detach(), tc, "float32")
    drafter = Eagle3BranchDrafter(proposer)
    head = proposer.head
    torch.manual_seed(0)
    features = torch.randn(len(COMMITTED) - 1, 3 * tc.hidden_size)  # [P, 3d]: real features of positions 0..P-1
    fork_points = SHAPES[shape]
    glue_req = GlueRequest(1, COMMITTED, SPEC, reserve=0, features=features, features_start=0)
    glue, seen, tokens = _run(drafter, glue_req, fork_points)

    def step(ids, hidden, cache):  # noqa: ANN001, ANN202
        out, logits = head(torch.tensor(ids), hidden, cache)
        return out[-1:], logits[-1]

    with torch.no_grad():
        cache = head.new_cache()
        out, logits = head(torch.tensor(COMMITTED[1:]), head.fuse(features), cache)
        real_hidden, rows = out[-1:], [logits[-1]]
        hidden = real_hidden
        glue_hiddens = [hidden]
        for t in SPEC:
            hidden, row = step([t], hidden, cache)
            glue_hiddens.append(hidden)
            rows.append(row)
        assert torch.allclose(glue, torch.stack(rows), atol=1e-4)  # both [m+1, Vd]
        for r, (j, g) in enumerate(zip(fork_points, _guesses(fork_points), strict=True)):
            branch_cache = head.new_cache()
            head(torch.tensor(COMMITTED[1:]), head.fuse(features), branch_cache)
            hidden = real_hidden
            for t in SPEC[:j]:
                hidden, _ = step([t], hidden, branch_cache)
            token = g
            for d in range(DEPTH):
                hidden, ref = step([token], hidden, branch_cache)
                assert torch.allclose(seen[d][r], ref, atol=1e-4), (shape, r, d)
                token = int(tokens[r, d])


def test_eagle3_glue_after_a_backup_reuses_the_chain_steps(tiny, tmp_path):
    """A glue right after the head drafted the same speculation as a chain (SSD's backup) runs only the last step,
    and its logits, and the branches decoded after it, equal those of a glue from scratch on a fresh head."""
    target, hf = tiny
    write_tiny_head(tmp_path, target)
    tc = load_model_config(target)
    torch.manual_seed(0)
    features = torch.randn(len(COMMITTED) - 1, 3 * tc.hidden_size)  # [P, 3d]
    fork_points = SHAPES["geometric"]
    drafters = [Eagle3BranchDrafter(Eagle3Proposer(tmp_path, hf.model.embed_tokens.weight.detach(), tc, "float32"))
                for _ in range(2)]
    backup = ProposeRequest(1, COMMITTED, len(SPEC), 0.0, torch.Generator(), None, features, 0)
    spec = drafters[0].proposer.propose([backup])[0].tokens  # the chain the backup answered with
    head = drafters[0].proposer.head
    calls = []
    forward_many = head.forward_many
    head.forward_many = lambda *a: calls.append(len(a[0])) or forward_many(*a)
    after_backup = drafters[0].glue([GlueRequest(1, COMMITTED, spec, reserve=0)])[0]  # features consumed
    head.forward_many = forward_many
    assert calls == [1]  # the chain's m - 1 steps are not run again
    scratch = drafters[1].glue([GlueRequest(1, COMMITTED, spec, reserve=0, features=features)])[0]
    assert torch.allclose(after_backup, scratch, atol=1e-5)  # both [m+1, Vd]
    results = []
    for drafter in drafters:
        seen = []

        def pick(d, logits, drafter=drafter, seen=seen):  # noqa: ANN001, ANN202
            seen.append(logits[0].clone())
            return [drafter.vocab.to_target(logits[0].argmax(dim=-1).tolist())]

        req = BranchRequest(1, len(COMMITTED), len(spec) + 1, fork_points, _guesses(fork_points))
        results.append((drafter.decode_branches([req], DEPTH, pick)[0], seen))
    (tokens_a, seen_a), (tokens_b, seen_b) = results
    assert torch.equal(tokens_a, tokens_b)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(seen_a, seen_b, strict=True))


def test_eagle3_chain_steps_serve_one_glue_of_the_same_speculation(tiny, tmp_path):
    """A chain's steps serve one glue only (its KV is glue KV after it), and never a speculation the chain did not
    draft."""
    target, hf = tiny
    write_tiny_head(tmp_path, target)
    tc = load_model_config(target)
    features = torch.randn(len(COMMITTED) - 1, 3 * tc.hidden_size)
    drafter = Eagle3BranchDrafter(Eagle3Proposer(tmp_path, hf.model.embed_tokens.weight.detach(), tc, "float32"))
    proposer = drafter.proposer
    spec = proposer.propose([ProposeRequest(1, COMMITTED, len(SPEC), 0.0, torch.Generator(), None, features, 0)])[0]
    assert proposer.drafted_steps(1, spec.tokens) is not None
    assert proposer.drafted_steps(1, [t + 1 for t in spec.tokens]) is None  # another speculation
    drafter.glue([GlueRequest(1, COMMITTED, spec.tokens, reserve=0)])
    assert proposer.drafted_steps(1, spec.tokens) is None  # the glue took them: its KV is glue KV now
