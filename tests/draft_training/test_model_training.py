"""`ssd train-draft --kind model` on tiny random models: layer choice and initialization, a training step that
lowers the loss, a saved folder that reloads bit-identically and proposes the same tokens, and a whole run
(data shard -> folder) that resumes from its checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draft_training import train_loop
from draft_training.data_gen import save_shard
from draft_training.dataset import DistilledSequence, make_model_batch
from draft_training.draft_vocab import DraftVocab
from draft_training.model_trainer import (
    ModelTrainConfig,
    build_draft,
    draft_logits,
    init_layer_indices,
    model_loss,
    save_trained_draft,
    train_draft_model,
)
from draft_training.target_features import CapturedSequence
from ssd.errors import InvalidRequestError
from ssd.loader.draft_checkpoint import EMBED_KEY
from ssd.loader.safetensors_loader import read_tensor
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.proposer import ProposeRequest
from tests.tiny_models import write_tiny_checkpoint

VOCAB = DraftVocab(torch.tensor([i for i in range(96) if i % 4 != 3]), 96, 1.0)  # 72 of the 96 target tokens


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    write_tiny_checkpoint(folder, "llama", seed=0, num_hidden_layers=4)
    return folder


def _config(target, **overrides) -> ModelTrainConfig:  # type: ignore[no-untyped-def]
    options = dict(target=str(target), num_layers=2, lr=3e-3, warmup_steps=1, batch_tokens=64, min_draft_vocab=16,
                   validation_fraction=0.2, is_bf16_autocast=False, epochs=2.0)
    return ModelTrainConfig(**{**options, **overrides})


def _sequence(n: int, prompt_len: int, seed: int) -> DistilledSequence:
    g = torch.Generator().manual_seed(seed)
    return DistilledSequence(tokens=torch.randint(0, 96, (n,), generator=g), features=torch.zeros(n, 0),
                             topk_ids=torch.randint(0, 96, (n, 4), generator=g),
                             topk_logprobs=torch.log_softmax(torch.randn(n, 4, generator=g) * 3, -1),
                             prompt_len=prompt_len)


def test_layer_choice_is_evenly_spaced_from_first_to_last():
    assert init_layer_indices(30, 4) == (0, 10, 19, 29)
    assert init_layer_indices(30, 2) == (0, 29)
    assert init_layer_indices(4, 4) == (0, 1, 2, 3)
    with pytest.raises(InvalidRequestError):
        init_layer_indices(4, 5)


def test_build_copies_the_target_layers_and_lm_head_rows(target):
    model = build_draft(_config(target), VOCAB)
    assert len(model.model.layers) == 2
    want = read_tensor(target, "model.layers.3.mlp.down_proj.weight")  # draft layer 1 <- target layer 3
    assert torch.equal(model.model.layers[1].mlp.down_proj.weight, want)
    assert torch.equal(model.lm_head.weight, read_tensor(target, "lm_head.weight")[VOCAB.target_ids])
    assert not model.model.embed_tokens.weight.requires_grad


def test_model_batch_alignment():
    seqs = [_sequence(7, 3, 0), _sequence(5, 2, 1)]
    batch = make_model_batch(seqs, VOCAB.target_to_draft(), prompt_loss_weight=0.5)
    assert batch.input_ids.shape == (2, 7) and torch.equal(batch.input_ids[1, :5], seqs[1].tokens)
    assert batch.weights[0].tolist()[:3] == [0.5, 0.5, 1.0]  # row 2 predicts x_3, the first answer token
    assert (batch.weights[1, 5:] == 0).all() and not batch.attention_mask[1, 5:].any()
    kept = VOCAB.target_to_draft()[seqs[0].topk_ids] >= 0
    assert torch.equal(batch.label_probs[0] > 0, kept)  # labels outside the draft vocabulary carry no mass


def test_training_steps_lower_the_loss_on_a_fixed_batch(target):
    config = _config(target)
    model = build_draft(config, VOCAB)
    batch = make_model_batch([_sequence(12, 4, 0), _sequence(9, 3, 1)], VOCAB.target_to_draft(), 0.3)
    loss = lambda b, top1: model_loss(model, b, config, top1)  # noqa: E731
    optimizer = train_loop.make_optimizer(model, config)
    before = float(loss(batch, False)[0].detach())
    for _ in range(10):
        train_loop.optimizer_step(model, optimizer, loss, batch, config, False)
    assert float(loss(batch, False)[0].detach()) < 0.8 * before


def test_saved_draft_reloads_bit_identically_and_proposes_the_same_tokens(target, tmp_path):
    model = build_draft(_config(target), VOCAB)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.01)  # not the initialization any more
    save_trained_draft(model, VOCAB, tmp_path, target, torch.float32)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert EMBED_KEY not in stored
    for name, value in model.state_dict().items():
        if name != EMBED_KEY:
            assert torch.equal(stored[name], value), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 96 and config["output_vocab_size"] == 72
    assert config["architectures"] == ["LlamaForCausalLM"]
    prompt = [5, 6, 7, 8, 9, 5, 6]
    ids, want = list(prompt), []
    with torch.no_grad():
        for _ in range(4):
            t = int(VOCAB.target_ids[draft_logits(model, torch.tensor([ids]))[0, -1].argmax()])
            want.append(t)
            ids.append(t)
    for _ in range(2):  # two loads, the same proposal
        proposer = DraftModelProposer(tmp_path, "float32", 96, block_size=4, kv_cache_memory_mb=8)
        got = proposer.propose([ProposeRequest(1, prompt, 4, 0.0, torch.Generator())])[0].tokens
        assert got == want


def _write_shard(folder, seed: int) -> list:  # type: ignore[no-untyped-def]
    seqs = [_sequence(10 + i, 3, seed * 100 + i) for i in range(10)]
    captured = [CapturedSequence(s.tokens.tolist(), s.prompt_len, torch.zeros(len(s.tokens), 6), s.topk_ids,
                                 s.topk_logprobs) for s in seqs]
    path = folder / "shard-00000.safetensors"
    save_shard(path, captured)
    return [path]


def test_a_whole_run_saves_a_folder_and_resumes(target, tmp_path):
    shards = _write_shard(tmp_path, 0)
    config = _config(target)
    out, checkpoints = tmp_path / "draft", tmp_path / "checkpoints"
    summary = train_draft_model(config, shards, out, checkpoints, dtype=torch.float32)
    assert summary["steps"] > 0 and summary["init_layers"] == [0, 3] and (checkpoints / "latest.pt").is_file()
    assert len(summary["validation"]) == 2  # one pass an epoch
    first = load_file(str(out / "model.safetensors"))
    again = train_draft_model(config, shards, tmp_path / "again", checkpoints, dtype=torch.float32)
    assert again["steps"] == summary["steps"]  # resumed at the end: nothing left to train
    second = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert all(torch.equal(first[k], second[k]) for k in first)
    proposer = DraftModelProposer(out, "float32", 96, block_size=4, kv_cache_memory_mb=8)
    assert proposer.vocab.target_ids.numel() == summary["draft_vocab_size"]
