"""The engine and SSD flags every entry point generates from ssd/cli_flags.py CONFIG_FLAGS: the same names, their
own defaults (and a service's SSD_* environment), and EngineConfig's / SsdConfig's fields as the parse result."""

import argparse

import pytest

from cli.main import build_parser
from draft_service.config import parse_args as draft_args
from ssd.cli_flags import CONFIG_FLAGS, SSD_FIELDS, add_config_flags, options_from_args
from ssd.config import EngineConfig, SsdConfig
from target_service.config import parse_args as target_args

ENGINE_FIELDS = [name for name in CONFIG_FLAGS if name not in SSD_FIELDS]


def test_every_engine_flag_sets_its_engine_config_field():
    p = argparse.ArgumentParser()
    add_config_flags(p, ENGINE_FIELDS)
    args = p.parse_args(["--dtype", "float32", "--quantization", "int4:64", "--device", "cuda:1", "--threads", "3",
                         "--tp", "2", "--kv-cache-mb", "64", "--max-num-seqs", "4", "--prefill-chunk-tokens", "0",
                         "--max-model-len", "512", "--block-size", "8", "--no-prefix-caching", "--compile", "off",
                         "--enforce-eager", "--attention-backend", "torch"])
    options = options_from_args(args, ENGINE_FIELDS)
    assert options == dict(dtype="float32", quantization="int4:64", device="cuda:1", num_threads=3,
                           tensor_parallel_size=2, kv_cache_memory_mb=64, max_num_seqs=4, prefill_chunk_tokens=0,
                           max_model_len=512, block_size=8, enable_prefix_caching=False, compile="off",
                           enforce_eager=True, attention_backend="torch")
    defaults = options_from_args(p.parse_args([]), ENGINE_FIELDS)
    assert EngineConfig("m", **defaults) == EngineConfig("m")  # no flag given: the engine's own defaults


def test_the_ssd_flags_set_ssd_config_fields():
    p = argparse.ArgumentParser()
    add_config_flags(p, SSD_FIELDS)
    assert SsdConfig(**options_from_args(p.parse_args([]), SSD_FIELDS)) == SsdConfig()
    args = p.parse_args(["--f", "3", "--fan-out", "uniform", "--backup", "fast", "--backup-max-neural-batch", "2",
                         "--saguaro-c", "0.5"])
    assert SsdConfig(**options_from_args(args, SSD_FIELDS)) == SsdConfig(3, "uniform", "fast", 2, 0.5)
    assert p.parse_args(["--fan-out-budget", "5"]).fan_out_budget == 5  # the draft service's name for --f


def test_entry_points_keep_their_defaults_and_environment(monkeypatch):
    assert target_args([]).engine == EngineConfig("smollm2-135m-instruct", num_threads=1, kv_cache_memory_mb=512)
    draft = draft_args([]).engine
    assert (draft.model, draft.dtype, draft.num_threads, draft.kv_cache_memory_mb) == ("ngram", "float32", 1, 256)
    monkeypatch.setenv("SSD_TARGET_THREADS", "3")
    monkeypatch.setenv("SSD_TARGET_COMPILE", "off")
    monkeypatch.setenv("SSD_DRAFT_KV_MB", "32")
    monkeypatch.setenv("SSD_DRAFT_FAN_OUT_BUDGET", "5")
    assert (target_args([]).engine.num_threads, target_args([]).engine.compile) == (3, "off")
    assert target_args(["--threads", "2"]).engine.num_threads == 2  # a flag beats the environment
    assert (draft_args([]).engine.kv_cache_memory_mb, draft_args([]).ssd.fan_out_budget) == (32, 5)
    generate = build_parser().parse_args(["generate", "--prompt", "hi", "--dtype", "float16"])
    assert (generate.dtype, generate.num_threads) == ("float16", None)  # ssd generate: torch's thread default
    bench = build_parser().parse_args(["bench"])
    assert bench.num_threads == 2


def test_a_bad_quantization_is_a_usage_error():
    with pytest.raises(SystemExit):
        target_args(["--quantization", "int3"])
