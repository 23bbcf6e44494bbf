"""Self-distillation data on the real default model: several shards per engine call hold exactly what one shard
per call holds (float32 greedy), and a finished cache is reused, never regenerated."""

from dataclasses import replace

from safetensors.torch import load_file

from ssd.draft_training.data_gen import DataConfig, generate_data


def _tokens(paths):  # type: ignore[no-untyped-def]
    return [load_file(str(p))["tokens"].tolist() for p in paths]


def test_grouped_generation_matches_one_shard_per_call(default_model_path, tmp_path):
    config = DataConfig(target=str(default_model_path), num_chat=3, num_code_stubs=1, num_code_chat=0, num_docs=0,
                        max_new_tokens=6, shard_size=2, dtype="float32", generation_batch=4, shards_per_call=2)
    grouped = generate_data(config, tmp_path / "grouped")
    single = generate_data(replace(config, generation_batch=1, shards_per_call=1), tmp_path / "single")
    assert [p.name for p in grouped] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert _tokens(grouped) == _tokens(single)
    stored = load_file(str(grouped[0]))
    assert stored["features"].shape == (len(stored["tokens"]), 3 * 576)
    assert stored["seq_starts"].tolist()[-1] == len(stored["tokens"])

    mtimes = [p.stat().st_mtime_ns for p in grouped]
    again = generate_data(replace(config, shards_per_call=1), tmp_path / "grouped")  # speed options may differ
    assert again == grouped and [p.stat().st_mtime_ns for p in again] == mtimes
