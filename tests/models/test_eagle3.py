"""EAGLE-3 head: incremental forward over a cache equals the batched forward; save/load round trip; loader errors."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ssd.errors import CheckpointError
from ssd.layers.padded_attention import KEY_BUCKET
from ssd.loader.eagle3_checkpoint import load_eagle3_head, save_eagle3_head
from ssd.model_config import RopeConfig
from ssd.models.eagle3 import Eagle3Config, Eagle3Head, HeadKVCache, default_aux_layers


def tiny_head(seed: int = 0, vocab: int = 96, draft_vocab: int = 40) -> Eagle3Head:
    torch.manual_seed(seed)
    config = Eagle3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        rms_norm_eps=1e-6, max_position_embeddings=256, vocab_size=vocab, draft_vocab_size=draft_vocab,
        target_hidden_size=24, aux_layers=(0, 1, 2), rope=RopeConfig(theta=10000.0),
    )
    head = Eagle3Head(config, torch.randn(vocab, 32))
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
        ids = torch.randperm(vocab)[:draft_vocab].sort().values
        head.d2t.copy_(ids - torch.arange(draft_vocab))
        head.t2d.zero_()
        head.t2d[ids] = True
    return head.eval()


def test_incremental_forward_equals_full_sequence():
    head = tiny_head()
    ids = torch.randint(0, 96, (1, 11))
    hidden = torch.randn(1, 11, 32)
    with torch.no_grad():
        full_out, full_logits = head.forward_train(ids, hidden)
        cache = HeadKVCache(2, 8, capacity=4)  # forces growth
        outs, logits = [], []
        for a, b in ((0, 5), (5, 6), (6, 9), (9, 11)):
            o, lg = head(ids[0, a:b], hidden[0, a:b], cache)
            outs.append(o)
            logits.append(lg)
    assert cache.length == 11
    torch.testing.assert_close(torch.cat(outs), full_out[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(logits), full_logits[0], atol=1e-5, rtol=1e-5)


def test_truncate_rolls_back():
    head = tiny_head()
    ids, hidden = torch.randint(0, 96, (6,)), torch.randn(6, 32)
    with torch.no_grad():
        cache = head.new_cache()
        head(ids[:4], hidden[:4], cache)
        _, first = head(ids[4:], hidden[4:], cache)
        cache.truncate(4)
        _, again = head(ids[4:], hidden[4:], cache)
    assert torch.equal(first, again)


def test_rows_past_the_length_are_masked_out():
    """Attention reads whole key buckets; rows past the cache length (zeros, or scratch of earlier drafts)
    must not count, in the causal forward and in the masked many-sequence forward."""
    head = tiny_head()
    ids, hidden = torch.randint(0, 96, (7,)), torch.randn(7, 32)
    with torch.no_grad():
        clean, dirty = head.new_cache(), head.new_cache(capacity=3)
        assert dirty.k.shape[0] == KEY_BUCKET  # capacity rounds up to whole buckets
        dirty.k.normal_(0, 100.0)
        dirty.v.normal_(0, 100.0)  # garbage in every row the sequence has not written
        _, expected = head(ids[:5], hidden[:5], clean)
        _, got = head(ids[:5], hidden[:5], dirty)
        torch.testing.assert_close(got, expected)
        assert len(dirty.bucket_kv()[0]) == KEY_BUCKET > dirty.length
        mask = torch.tensor([[True] * 5 + [True, False], [True] * 5 + [False, True]])  # two siblings
        args = ([ids[5:]], [hidden[5:]], [torch.tensor([5, 5])], [mask])
        _, (expected_many,) = head.forward_many(*args, [clean])
        _, (got_many,) = head.forward_many(*args, [dirty])
    torch.testing.assert_close(got_many, expected_many)


def test_padding_mask_leaves_real_positions_unchanged():
    head = tiny_head()
    ids, hidden = torch.randint(0, 96, (2, 7)), torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.no_grad():
        _, batched = head.forward_train(ids, hidden, mask)
        _, alone = head.forward_train(ids[1:, :4], hidden[1:, :4])
    torch.testing.assert_close(batched[1, :4], alone[0], atol=1e-5, rtol=1e-5)


def test_save_load_round_trip_is_bit_identical(tmp_path):
    head = tiny_head()
    save_eagle3_head(head, tmp_path)
    assert "embed_tokens.weight" not in load_file(tmp_path / "model.safetensors")
    loaded = load_eagle3_head(tmp_path, head.embed_tokens.weight, torch.float32)
    assert loaded.config == head.config
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids, hidden = torch.randint(0, 96, (5,)), torch.randn(5, 32)
    with torch.no_grad():
        _, want = head(ids, hidden, head.new_cache())
        _, got = loaded(ids, hidden, loaded.new_cache())
    assert torch.equal(want, got)
    assert torch.equal(loaded.to_target_ids(want.argmax(-1)), head.to_target_ids(got.argmax(-1)))


def test_to_target_ids_maps_into_t2d():
    head = tiny_head()
    target = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    assert head.t2d[target].all() and int(head.t2d.sum()) == head.config.draft_vocab_size


def test_feature_norm_makes_fuse_invariant_to_each_layers_scale(tmp_path):
    head = tiny_head()
    config = dataclasses.replace(head.config, feature_norm=True)
    normed = Eagle3Head(config, head.embed_tokens.weight)
    normed.load_state_dict(head.state_dict())
    features = torch.randn(5, 72)
    scaled = features * torch.tensor([1.0] * 24 + [300.0] * 24 + [0.1] * 24)
    torch.testing.assert_close(normed.fuse(scaled), normed.fuse(features), atol=1e-3, rtol=1e-3)
    save_eagle3_head(normed, tmp_path)
    assert load_eagle3_head(tmp_path, head.embed_tokens.weight, torch.float32).config.feature_norm


def test_config_json_is_eagle3_layout(tmp_path):
    head = tiny_head()
    save_eagle3_head(head, tmp_path, dtype=torch.bfloat16)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"]
    assert raw["draft_vocab_size"] == 40 and raw["target_hidden_size"] == 24 and raw["aux_layers"] == [0, 1, 2]
    tensors = load_file(tmp_path / "model.safetensors")
    assert tensors["fc.weight"].shape == (32, 72) and tensors["fc.weight"].dtype == torch.bfloat16
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (32, 64)


def test_loader_names_missing_and_misshaped_keys(tmp_path):
    head = tiny_head()
    save_eagle3_head(head, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["midlayer.mlp.up_proj.weight"]
    tensors["fc.weight"] = torch.zeros(32, 10)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_eagle3_head(tmp_path, head.embed_tokens.weight, torch.float32)
    assert "midlayer.mlp.up_proj.weight" in str(e.value) and "fc.weight" in str(e.value)


def test_loader_requires_an_embedding(tmp_path):
    head = tiny_head()
    save_eagle3_head(head, tmp_path)
    with pytest.raises(CheckpointError, match="embed_tokens"):
        load_eagle3_head(tmp_path, None, torch.float32)


def test_packed_head_drafts_like_the_unpacked_one():
    from ssd.layers.linear import pack_linear_weights

    head = tiny_head()
    ids, hidden = torch.tensor([3, 9, 27, 5]), torch.randn(4, head.config.hidden_size)
    with torch.inference_mode():
        plain_out, plain_logits = head(ids, hidden, head.new_cache())
        packed = pack_linear_weights(head)
        out, logits = head(ids, hidden, head.new_cache())
    assert packed == 9 or not torch.backends.mkldnn.is_available()  # every linear layer of the head
    torch.testing.assert_close(out, plain_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, plain_logits, rtol=1e-5, atol=1e-5)
    loss = head.forward_train(ids[None], hidden[None])[1].logsumexp(-1).sum()  # training ignores the packing
    loss.backward()
    assert head.lm_head.weight.grad is not None


def test_forward_many_equals_one_sequence_at_a_time():
    head = tiny_head()
    d = head.config.hidden_size
    g = torch.Generator().manual_seed(3)
    prefixes = [5, 2, 7]
    caches, solo = [], []
    for n in prefixes:  # two copies of each sequence's cache, filled alike
        ids, hid = torch.randint(0, 96, (n,), generator=g), torch.randn(n, d, generator=g)
        pair = (head.new_cache(), head.new_cache())
        with torch.inference_mode():
            for c in pair:
                head(ids, hid, c)
        caches.append(pair[0])
        solo.append(pair[1])
    new = [3, 1, 2]  # queries per sequence, with their own positions and masks
    ids = [torch.randint(0, 96, (m,), generator=g) for m in new]
    hid = [torch.randn(m, d, generator=g) for m in new]
    pos = [torch.arange(n, n + m) for n, m in zip(prefixes, new, strict=True)]
    masks = [torch.rand(m, n + m, generator=g) < 0.7 for n, m in zip(prefixes, new, strict=True)]
    for mask in masks:
        mask[:, 0] = True  # every query sees at least one key
    with torch.inference_mode():
        outs, logits = head.forward_many(ids, hid, pos, masks, caches)
        for i in range(3):
            out_i, logits_i = head.forward_masked(ids[i], hid[i], pos[i], masks[i], solo[i])
            torch.testing.assert_close(outs[i], out_i, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(logits[i], logits_i, rtol=1e-5, atol=1e-5)
            assert caches[i].length == solo[i].length == prefixes[i] + new[i]


def test_config_refuses_aux_layers_beyond_the_target(tmp_path):
    save_eagle3_head(tiny_head(), tmp_path)  # aux layers 0, 1, 2
    raw = json.loads((tmp_path / "config.json").read_text())
    assert Eagle3Config.from_dict(raw, target_num_layers=3).aux_layers == (0, 1, 2)
    with pytest.raises(CheckpointError, match="trained for another target"):
        Eagle3Config.from_dict(raw, target_num_layers=2)


def test_default_aux_layers_are_three_increasing_layers():
    assert default_aux_layers(30) == (2, 15, 27)  # the public EAGLE-3 convention for real targets
    for num_layers in range(3, 40):
        low, mid, high = default_aux_layers(num_layers)
        assert 0 <= low < mid < high < num_layers
    with pytest.raises(CheckpointError):
        default_aux_layers(2)


def test_packed_head_runs_masked_and_batched_forwards_like_the_unpacked_one():
    """Packed for inference, the head runs the CPU layer ops (fused q/k/v and gate/up, RoPE + KV store + attention
    in one call, each masked row as its own key list): the same rows, logits and cache as torch's ops."""
    from ssd.layers.linear import pack_linear_weights

    plain, fast = tiny_head(), tiny_head()
    pack_linear_weights(fast)
    assert fast.midlayer.self_attn.fused is not None and fast.midlayer.mlp.gate_up is not None
    d, g = plain.config.hidden_size, torch.Generator().manual_seed(5)
    prefixes, new = [6, 3], [3, 2]
    results = []
    for head in (plain, fast):
        g.manual_seed(5)
        caches = [head.new_cache(capacity=3) for _ in prefixes]  # forces growth
        with torch.inference_mode():
            for n, c in zip(prefixes, caches, strict=True):
                head(torch.randint(0, 96, (n,), generator=g), torch.randn(n, d, generator=g), c)
            masks = [torch.rand(m, n + m, generator=g) < 0.6 for n, m in zip(prefixes, new, strict=True)]
            for mask in masks:
                mask[:, 0] = True
            many = head.forward_many([torch.randint(0, 96, (m,), generator=g) for m in new],
                                     [torch.randn(m, d, generator=g) for m in new],
                                     [torch.arange(n, n + m) for n, m in zip(prefixes, new, strict=True)], masks, caches)
            for c, n in zip(caches, prefixes, strict=True):
                c.truncate(n)
            step = head.decode_step([7, 11], [torch.randn(d, generator=g) for _ in new], caches)
        results.append((many, step, [c.kv[:, :, : c.length] for c in caches]))
    for want, got in zip(*results, strict=True):
        for a, b in zip(want, got, strict=True):
            for x, y in zip(a, b, strict=True):
                torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5)
