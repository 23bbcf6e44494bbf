"""The EAGLE-3 proposer's token trees (one tree-masked head forward per depth for every tree) equal a reference
that runs the head on each node's own path alone, in float32, for several tree shapes and a batch of trees."""

import pytest
import torch

from ssd.config import TreeShape
from ssd.model_config import load_model_config
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.eagle3_tree import TokenTree
from ssd.speculation.proposer import ProposeRequest
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 40, 41], [20, 21, 22, 23, 24]]  # the last token of each has no KV yet
SHAPES = [TreeShape(budget=8, depth=3, top_k=2), TreeShape(budget=12, depth=4, top_k=3),
          TreeShape(budget=5, depth=5, top_k=1), TreeShape(budget=3, depth=2, top_k=4)]


@pytest.fixture(scope="module")
def proposer_parts(tmp_path_factory):
    target, head_dir = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("eagle3")
    hf = write_tiny_checkpoint(target, "llama", seed=0).float().eval()
    write_tiny_head(head_dir, target)
    config = load_model_config(target)
    torch.manual_seed(0)
    features = [torch.randn(len(p) - 1, 3 * config.hidden_size) for p in PROMPTS]  # [P-1, 3d] each
    return head_dir, hf.model.embed_tokens.weight.detach(), config, features


def _request(seq_id: int, prompt: list[int], features: torch.Tensor, shape: TreeShape, k: int) -> ProposeRequest:
    return ProposeRequest(seq_id, prompt, k, 0.0, torch.Generator(), shape, features, 0)


@torch.no_grad()
def _reference(head, prompt, features, shape, k):  # noqa: ANN001, ANN202
    """EAGLE-2 selection; every expanded node runs the head over the real positions and its own path only.
    -> (tokens, parents, scores, {path of an expanded node: its next-token log-probs [Vd]})."""
    fused = head.fuse(features)

    def run(path: list[int]) -> torch.Tensor:  # the next-token log-probs after `path` [Vd]
        cache = head.new_cache()
        out, logits = head(torch.tensor(prompt[1:]), fused, cache)
        hidden, row = out[-1:], logits[-1]
        for t in path:
            out, logits = head(torch.tensor([t]), hidden, cache)
            hidden, row = out[-1:], logits[-1]
        return torch.log_softmax(row.float(), dim=-1)

    nodes = [(-1, -1, 0.0, [])]  # (token, parent, score, path)
    logprobs, frontier, limit = {0: run([])}, [0], min(k, shape.depth)
    for depth in range(1, limit + 1):
        cand = []
        for i in frontier:
            top = torch.topk(logprobs[i], shape.top_k)
            cand += [(nodes[i][2] + v, i, t) for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)]
        cand = sorted(cand, key=lambda c: -c[0])[: shape.budget - (len(nodes) - 1)]
        frontier = []
        for score, parent, draft_id in cand:
            token = int(head.to_target_ids(torch.tensor(draft_id)))
            nodes.append((token, parent, score, nodes[parent][3] + [token]))
            frontier.append(len(nodes) - 1)
        if not cand or depth == limit or len(nodes) - 1 >= shape.budget:
            break
        for i in frontier:
            logprobs[i] = run(nodes[i][3])
    expanded = {tuple(nodes[i][3]): lp for i, lp in logprobs.items() if i > 0}
    return [n[0] for n in nodes[1:]], [n[1] for n in nodes[1:]], [n[2] for n in nodes[1:]], expanded


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"b{s.budget}-d{s.depth}-k{s.top_k}")
def test_batched_trees_equal_per_node_reference(proposer_parts, shape, monkeypatch):
    head_dir, embedding, config, features = proposer_parts
    proposer = Eagle3Proposer(head_dir, embedding, config, "float32")
    k = 4
    seen: list[dict[tuple[int, ...], torch.Tensor]] = [{} for _ in PROMPTS]  # per tree: path -> log-probs [Vd]
    record = TokenTree.expanded

    def expanded(tree, hidden, logprobs):  # noqa: ANN001, ANN202
        paths = tree.speculation().paths()
        which = next(i for i, p in enumerate(PROMPTS) if tree.prefix == len(p) - 1)
        seen[which].update({tuple(paths[node]): row for node, row in zip(tree.frontier, logprobs, strict=True)})
        record(tree, hidden, logprobs)

    monkeypatch.setattr(TokenTree, "expanded", expanded)
    requests = [_request(i, p, f, shape, k) for i, (p, f) in enumerate(zip(PROMPTS, features, strict=True))]
    specs = proposer.propose(requests)
    for spec, prompt, feats, logprobs in zip(specs, PROMPTS, features, seen, strict=True):
        tokens, parents, _, expected = _reference(proposer.head, prompt, feats, shape, k)
        assert spec.tokens == tokens
        assert spec.parents == parents
        assert len(spec.tokens) <= shape.budget
        assert logprobs.keys() == expected.keys()
        for path, row in expected.items():  # every expanded node saw exactly its own ancestors
            assert torch.allclose(logprobs[path], row, atol=1e-4), path


def test_tree_and_chain_requests_share_a_round(proposer_parts):
    """A chain request beside a tree request; a second round truncates the scratch rows and drafts the same."""
    head_dir, embedding, config, features = proposer_parts
    proposer = Eagle3Proposer(head_dir, embedding, config, "float32")
    shape = SHAPES[0]
    requests = [_request(0, PROMPTS[0], features[0], shape, 3),
                ProposeRequest(1, PROMPTS[1], 3, 0.0, torch.Generator(), None, features[1], 0)]
    first = proposer.propose(requests)
    again = proposer.propose([_request(0, PROMPTS[0], None, shape, 3), requests[1]])
    tokens, parents, _, _ = _reference(proposer.head, PROMPTS[0], features[0], shape, 3)
    assert (first[0].tokens, first[0].parents) == (tokens, parents)
    assert first[1].parents is None and len(first[1].tokens) == 3
    assert [(s.tokens, s.parents) for s in again] == [(s.tokens, s.parents) for s in first]
