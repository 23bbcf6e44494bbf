"""`ssd train-draft --unroll-warmup-fraction`: a teacher-forced phase, then the full unroll from its weights."""

import argparse
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draft_training.cli import add_draft_training_commands
from draft_training.train_loop import trained_options as _trained_options
from draft_training.trainer import TrainConfig, train_head, training_phases
from ssd.errors import InvalidRequestError
from ssd.loader.safetensors_loader import iter_tensors


def test_phases_split_the_budget_and_the_unroll() -> None:
    config = TrainConfig(target="t", epochs=4.0, num_unroll=3, max_train_minutes=10.0, unroll_warmup_fraction=0.25)
    first, second = training_phases(config)
    assert (first.num_unroll, first.epochs, first.max_train_minutes) == (1, 1.0, 2.5)
    assert (second.num_unroll, second.epochs, second.max_train_minutes) == (3, 3.0, 7.5)
    assert training_phases(replace(config, unroll_warmup_fraction=0.0)) == [replace(config, unroll_warmup_fraction=0.0)]
    assert len(training_phases(replace(config, num_unroll=1))) == 1  # nothing to warm up to
    with pytest.raises(InvalidRequestError, match="below 1"):
        training_phases(replace(config, unroll_warmup_fraction=1.0))


def test_flag_takes_a_fraction() -> None:
    parser = argparse.ArgumentParser()
    add_draft_training_commands(parser.add_subparsers())
    base = ["train-draft", "--target", "t", "--out", "o"]
    assert parser.parse_args(base).unroll_warmup_fraction == 0.5
    assert parser.parse_args([*base, "--unroll-warmup-fraction", "0.5"]).unroll_warmup_fraction == 0.5
    for bad in ("1", "-0.1", "half"):
        with pytest.raises(SystemExit):
            parser.parse_args([*base, "--unroll-warmup-fraction", bad])


def _write_shard(path: Path, num_seqs: int, features: int) -> None:
    """Random self-distillation data in the on-disk shard layout (tokens over the tiny models' 96 ids)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 20, (num_seqs,), generator=g)
    n = int(lengths.sum())
    save_file({
        "tokens": torch.randint(0, 96, (n,), generator=g, dtype=torch.int32),
        "features": torch.randn(n, features, generator=g).to(torch.bfloat16),
        "topk_ids": torch.randint(0, 96, (n, 4), generator=g, dtype=torch.int32),
        "topk_logprobs": torch.log_softmax(torch.randn(n, 4, generator=g) * 3, -1),
        "seq_starts": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "prompt_lens": torch.full((num_seqs,), 3),
    }, str(path))


def test_curriculum_trains_both_phases_and_resumes_after_the_last(tiny_llama, tmp_path: Path) -> None:
    shard = tmp_path / "shard-00000.safetensors"
    _write_shard(shard, num_seqs=40, features=3 * 64)
    config = TrainConfig(target=str(tiny_llama), epochs=2.0, num_unroll=2, unroll_warmup_fraction=0.5,
                         batch_tokens=64, min_draft_vocab=16, validation_fraction=0.1, is_bf16_autocast=False)
    out, checkpoints = tmp_path / "head", tmp_path / "checkpoints"
    summary = train_head(config, [shard], out, checkpoints)
    phases = [entry["phase"] for entry in summary["validation"]]
    assert summary["phases"] == 2 and phases == sorted(phases) and set(phases) == {0, 1}
    assert all(len(entry["val_top1"]) == 2 for entry in summary["validation"])  # validated at the full unroll
    assert torch.load(checkpoints / "latest.pt", weights_only=False)["phase"] == 1
    trained = dict(iter_tensors(out))

    again = train_head(config, [shard], tmp_path / "again", checkpoints)  # resumes at the end of phase 1
    assert again["validation"] == []
    for name, tensor in iter_tensors(tmp_path / "again"):
        assert torch.equal(tensor, trained[name]), name


def test_a_checkpoint_from_before_the_curriculum_resumes_only_without_it() -> None:
    old = {k: v for k, v in asdict(TrainConfig(target="t", unroll_warmup_fraction=0.0)).items()
           if k != "unroll_warmup_fraction"}  # written before the option existed: trained without a warm-up
    assert _trained_options(old) == _trained_options(asdict(TrainConfig(target="t", unroll_warmup_fraction=0.0)))
    assert _trained_options(old) != _trained_options(asdict(TrainConfig(target="t")))
