"""Self-distillation data on the real default model: shards hold the target's answers with their features,
and a finished cache is reused, never regenerated."""

import argparse

import pytest
from safetensors.torch import load_file

from draft_training.cli import add_draft_training_commands
from draft_training.data_gen import DataConfig, generate_data
from ssd.errors import InvalidRequestError


def test_shards_are_written_once_and_reused(default_model_path, tmp_path):
    config = DataConfig(target=str(default_model_path), num_chat=3, num_code_stubs=1, num_code_chat=0, num_docs=0, num_tasks=0,
                        max_new_tokens=6, shard_size=2, dtype="float32")
    paths = generate_data(config, tmp_path / "data")
    assert [p.name for p in paths] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    stored = load_file(str(paths[0]))
    assert stored["features"].shape == (len(stored["tokens"]), 3 * 576)
    assert stored["seq_starts"].tolist()[-1] == len(stored["tokens"])
    assert stored["topk_ids"].shape == (len(stored["tokens"]), config.top_k)

    mtimes = [p.stat().st_mtime_ns for p in paths]
    again = generate_data(config, tmp_path / "data")
    assert again == paths and [p.stat().st_mtime_ns for p in again] == mtimes


def test_aux_layers_flag_and_range(tiny_llama):
    parser = argparse.ArgumentParser()
    add_draft_training_commands(parser.add_subparsers())
    args = parser.parse_args(["train-draft", "--target", "t", "--out", "o", "--aux-layers", "2,15,29"])
    assert args.aux_layers == (2, 15, 29)
    for bad in ("2,15", "15,2,29", "a,b,c", "2,2,29"):
        with pytest.raises(SystemExit):
            parser.parse_args(["train-draft", "--target", "t", "--out", "o", "--aux-layers", bad])
    assert DataConfig(target=str(tiny_llama), aux_layers=(0, 1, 2)).resolved_aux_layers() == (0, 1, 2)
    with pytest.raises(InvalidRequestError, match="below the target's 3 layers"):
        DataConfig(target=str(tiny_llama), aux_layers=(0, 1, 3)).resolved_aux_layers()
