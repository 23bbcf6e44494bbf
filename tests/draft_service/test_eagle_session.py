"""A draft Session over an EAGLE-3 head: features off the wire give the same drafts as in process; gaps give none."""

import pytest
import torch

from draft_service.config import DraftServiceConfig, draft_engine
from draft_service.proposers import build_service_proposer
from draft_service.session import Session
from protos.ssd.v1 import common_pb2, draft_pb2
from rpc.tensors import to_tensor
from ssd.errors import CheckpointError, InvalidRequestError
from ssd.model_config import load_model_config
from ssd.speculation.eagle3_proposer import Eagle3Proposer
from ssd.speculation.proposer import ProposeRequest
from tests.speculation.test_eagle3_sd import tiny_target_and_head
from tests.tiny_models import write_tiny_checkpoint

PROMPT = [5, 6, 7, 8, 9, 10, 11]
K = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


@pytest.fixture
def session(folders):
    target, head = folders
    draft = build_service_proposer(DraftServiceConfig(draft_engine(str(head)), target_model=str(target)))
    return Session(draft.proposer, "test", draft.feature_width)


def wire(features: torch.Tensor) -> common_pb2.Tensor:  # [n, F]
    if features.dtype == torch.bfloat16:
        return to_tensor(features.view(torch.int16).numpy(), dtype="bfloat16")
    return to_tensor(features.numpy())


def in_process(folders, steps: list[tuple[list[int], int, torch.Tensor]]) -> list[list[int]]:
    """The same proposals from an Eagle3Proposer fed directly (as the engine feeds it)."""
    target, head = folders
    from ssd.loader.safetensors_loader import iter_tensors

    embedding = dict(iter_tensors(target))["model.embed_tokens.weight"]
    proposer = Eagle3Proposer(head, embedding, load_model_config(target), "float32")
    gen = torch.Generator()
    return [proposer.propose([ProposeRequest(1, tokens, K, 0.0, gen, None, feats, start)])[0].tokens
            for tokens, start, feats in steps]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_features_over_the_session_draft_as_in_process(folders, session, dtype):
    width = session.feature_width
    assert width == 3 * load_model_config(folders[0]).hidden_size
    torch.manual_seed(0)
    prompt_feats = torch.randn(len(PROMPT), width).to(dtype)  # positions 0..6
    tokens = [*PROMPT, 40]  # + the first sampled token
    first = session.run_round(draft_pb2.Round(num_speculative_tokens=K, prefills=[draft_pb2.Prefill(
        seq_id=7, token_ids=tokens, features=wire(prompt_feats), features_start=0)]))
    assert not first.errors and len(first.items[0].token_ids) == K
    new = [first.items[0].token_ids[0], 41]  # one accepted + a bonus token
    verify_feats = torch.randn(2, width).to(dtype)  # root (position 7) + the accepted one
    second = session.run_round(draft_pb2.Round(num_speculative_tokens=K, outcomes=[draft_pb2.Outcome(
        seq_id=7, num_committed_before=len(tokens), new_token_ids=new, num_accepted=1, bonus_token=41,
        features=wire(verify_feats), features_start=len(tokens) - 1)]))
    expected = in_process(folders, [(tokens, 0, prompt_feats), (tokens + new, len(tokens) - 1, verify_feats)])
    assert [list(first.items[0].token_ids), list(second.items[0].token_ids)] == expected


def test_sequences_without_prompt_features_get_empty_speculations(session):
    width = session.feature_width
    tokens = [*PROMPT, 40]
    late = draft_pb2.Prefill(seq_id=1, token_ids=tokens, features=wire(torch.randn(1, width)),
                             features_start=len(tokens) - 1)  # re-sent after a reconnect: old features gone
    bare = draft_pb2.Prefill(seq_id=2, token_ids=tokens)
    full = draft_pb2.Prefill(seq_id=3, token_ids=tokens, features=wire(torch.randn(len(PROMPT), width)))
    out = session.run_round(draft_pb2.Round(num_speculative_tokens=K, prefills=[late, bare, full]))
    by_id = {item.seq_id: list(item.token_ids) for item in out.items}
    assert not out.errors and by_id[1] == [] and by_id[2] == [] and len(by_id[3]) == K
    more = draft_pb2.Outcome(seq_id=1, num_committed_before=len(tokens), new_token_ids=[42], num_accepted=0,
                             bonus_token=42, features=wire(torch.randn(1, width)), features_start=len(tokens))
    again = session.run_round(draft_pb2.Round(num_speculative_tokens=K, outcomes=[more]))
    assert not again.errors and list(again.items[0].token_ids) == []  # the gap is never filled


def test_malformed_features_are_a_sequence_error(session):
    bad = draft_pb2.Prefill(seq_id=5, token_ids=[*PROMPT, 40], features=wire(torch.randn(len(PROMPT), 3)))
    out = session.run_round(draft_pb2.Round(num_speculative_tokens=K, prefills=[bad]))
    assert not out.items and out.errors[0].code == "INVALID_ARGUMENT" and "features" in out.errors[0].message
    assert 5 not in session.seqs


def test_eagle_head_needs_a_matching_target_model(folders, tmp_path):
    target, head = folders
    with pytest.raises(InvalidRequestError, match="--target-model"):
        build_service_proposer(DraftServiceConfig(draft_engine(str(head))))
    other = tmp_path / "wider"
    write_tiny_checkpoint(other, "llama", hidden_size=96)
    with pytest.raises((InvalidRequestError, CheckpointError), match="width|embed"):
        build_service_proposer(DraftServiceConfig(draft_engine(str(head)), target_model=str(other)))
