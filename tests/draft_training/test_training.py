"""Draft training on tiny random models: vocabulary trimming, batches, the unrolled forward, one training step."""

import torch

from draft_training.dataset import DistilledSequence, batch_plan, make_batch
from draft_training.draft_vocab import DraftVocab, choose_draft_vocab, token_mass
from draft_training.trainer import TrainConfig, batch_loss, init_head
from draft_training.unroll import unrolled_logits
from ssd.models.eagle3 import Eagle3Config, default_aux_layers
from tests.models.test_eagle3 import tiny_head


def test_vocab_trimming_and_maps_round_trip():
    ids = torch.tensor([[5, 7], [5, 9], [7, 5]])
    logprobs = torch.tensor([[0.7, 0.2], [0.6, 0.1], [0.5, 0.4]]).log()
    mass = token_mass(ids, logprobs, vocab_size=12)
    assert torch.allclose(mass[[5, 7, 9]], torch.tensor([1.7, 0.7, 0.1], dtype=torch.float64))
    vocab = choose_draft_vocab(mass, total_mass=3.0, coverage=0.75, min_size=1, max_size=10)
    assert vocab.target_ids.tolist() == [5, 7]  # 1.7 + 0.7 = 2.4 >= 0.75 * 3
    assert abs(vocab.coverage - 0.8) < 1e-6
    draft_ids = torch.arange(vocab.size)
    target_ids = draft_ids + vocab.d2t
    assert target_ids.tolist() == [5, 7]
    assert vocab.t2d.nonzero().flatten().tolist() == [5, 7]
    assert torch.equal(vocab.target_to_draft()[target_ids], draft_ids)
    assert vocab.target_to_draft()[9] == -1
    clamped = choose_draft_vocab(mass, 3.0, 0.75, min_size=3, max_size=10)
    assert clamped.size == 3


def _sequence(n: int, prompt_len: int, seed: int) -> DistilledSequence:
    g = torch.Generator().manual_seed(seed)
    return DistilledSequence(
        tokens=torch.randint(0, 96, (n,), generator=g),
        features=torch.randn(n, 72, generator=g).to(torch.bfloat16),
        topk_ids=torch.randint(0, 96, (n, 4), generator=g),
        topk_logprobs=torch.log_softmax(torch.randn(n, 4, generator=g) * 3, -1),
        prompt_len=prompt_len,
    )


def _fixed_batch(head, num_unroll: int = 2):  # type: ignore[no-untyped-def]
    index = torch.full((96,), -1, dtype=torch.long)
    target_ids = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    index[target_ids] = torch.arange(head.config.draft_vocab_size)
    return make_batch([_sequence(12, 4, 0), _sequence(9, 3, 1)], index, num_unroll, prompt_loss_weight=0.5)


def test_batch_alignment():
    head = tiny_head()
    seqs = [_sequence(12, 4, 0), _sequence(9, 3, 1)]
    batch = _fixed_batch(head)
    assert batch.input_ids.shape == (2, 11)
    assert torch.equal(batch.input_ids[1, :8], seqs[1].tokens[1:])  # head position j reads x_{j+1}
    assert not batch.attention_mask[1, 8:].any()
    assert batch.weights[0, 0] == 0.5 and batch.weights[0, 2] == 1.0  # row 2 predicts x_4, the first answer token
    assert batch.label_ids.shape == (2, 12, 4) and (batch.weights[1, 8:] == 0).all()


def test_batch_plan_respects_token_budget():
    plan = batch_plan([10, 50, 12, 48, 30], batch_tokens=100, generator=torch.Generator().manual_seed(0))
    assert sorted(i for g in plan for i in g) == [0, 1, 2, 3, 4]
    lengths = [10, 50, 12, 48, 30]
    assert all(len(g) * max(lengths[i] for i in g) <= 100 for g in plan)


def test_unroll_step_zero_equals_forward_train():
    head = tiny_head()
    ids, hidden = torch.randint(0, 96, (2, 7)), torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        steps = unrolled_logits(head, ids, hidden, mask, num_steps=3)
        _, want = head.forward_train(ids, hidden, mask)
    assert len(steps) == 3
    torch.testing.assert_close(steps[0], want, atol=1e-5, rtol=1e-5)


def test_unroll_step_one_equals_incremental_drafting():
    head = tiny_head()
    ids, hidden = torch.randint(0, 96, (1, 6)), torch.randn(1, 6, 32)
    with torch.no_grad():
        steps = unrolled_logits(head, ids, hidden, torch.ones(1, 6, dtype=torch.bool), num_steps=2)
        j = 3  # a round starting after true position j: step 1 reads (x_{j+2}, own out_hidden at j)
        cache = head.new_cache()
        out, _ = head(ids[0, : j + 1], hidden[0, : j + 1], cache)
        _, logits = head(ids[0, j + 1 : j + 2], out[-1:], cache)
    torch.testing.assert_close(steps[1][0, j], logits[0], atol=1e-5, rtol=1e-5)


def test_one_training_step_lowers_the_loss():
    head = tiny_head().train()
    batch = _fixed_batch(head)
    config = TrainConfig(target="unused", num_unroll=2)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    before, _, _ = batch_loss(head, batch, config)
    optimizer.zero_grad()
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after, _, _ = batch_loss(head, batch, config)
    assert float(after) < float(before.detach())


def test_head_config_carries_the_data_aux_layers(tiny_llama):
    vocab = DraftVocab(torch.arange(0, 96, 2), 96, 1.0)  # every other target token
    head = init_head(TrainConfig(target=str(tiny_llama), aux_layers=(0, 1, 2)), vocab)
    assert head.config.aux_layers == (0, 1, 2)
    default = init_head(TrainConfig(target=str(tiny_llama)), vocab).config.aux_layers
    assert default == default_aux_layers(3)  # the tiny target has 3 layers


def test_a_wider_head_mlp_is_built_and_round_trips(tiny_llama):
    vocab = DraftVocab(torch.arange(0, 96, 2), 96, 1.0)
    head = init_head(TrainConfig(target=str(tiny_llama), intermediate_size=40), vocab)
    assert head.config.intermediate_size == 40
    assert Eagle3Config.from_dict(head.config.to_dict()).intermediate_size == 40


def test_unroll_step_two_equals_incremental_drafting():
    head = tiny_head()
    ids, hidden = torch.randint(0, 96, (2, 7)), torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 6:] = False  # a padded row in the batch must not change the real one
    with torch.no_grad():
        steps = unrolled_logits(head, ids, hidden, mask, num_steps=3)
        j = 2  # a round after true position j: steps 1 and 2 read x_{j+2}, x_{j+3} and their own out_hidden
        cache = head.new_cache()
        out, _ = head(ids[0, : j + 1], hidden[0, : j + 1], cache)
        out, _ = head(ids[0, j + 1 : j + 2], out[-1:], cache)
        _, logits = head(ids[0, j + 2 : j + 3], out, cache)
    torch.testing.assert_close(steps[2][0, j], logits[0], atol=1e-5, rtol=1e-5)
