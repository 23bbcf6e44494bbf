"""The engine flags every entry point generates from ssd/cli_flags.py ENGINE_FLAGS: the same names, their own
defaults (and a service's SSD_* environment), and EngineConfig's fields as the parse result."""

import argparse

import pytest

from cli.main import build_parser
from draft_service.config import parse_args as draft_args
from ssd.cli_flags import ENGINE_FLAGS, add_engine_flags, engine_options_from_args
from ssd.config import EngineConfig
from target_service.config import parse_args as target_args


def test_every_engine_flag_sets_its_engine_config_field():
    p = argparse.ArgumentParser()
    add_engine_flags(p, ENGINE_FLAGS)
    args = p.parse_args(["--dtype", "float32", "--quantization", "int4:64", "--device", "cuda:1", "--threads", "3",
                         "--tp", "2", "--kv-cache-mb", "64", "--max-num-seqs", "4", "--prefill-chunk-tokens", "0",
                         "--max-model-len", "512", "--block-size", "8", "--no-prefix-caching", "--compile", "off",
                         "--enforce-eager", "--attention-backend", "torch"])
    options = engine_options_from_args(args, ENGINE_FLAGS)
    assert options == dict(dtype="float32", quantization="int4:64", device="cuda:1", num_threads=3,
                           tensor_parallel_size=2, kv_cache_memory_mb=64, max_num_seqs=4, prefill_chunk_tokens=0,
                           max_model_len=512, block_size=8, enable_prefix_caching=False, compile="off",
                           enforce_eager=True, attention_backend="torch")
    defaults = engine_options_from_args(p.parse_args([]), ENGINE_FLAGS)
    assert EngineConfig("m", **defaults) == EngineConfig("m")  # no flag given: the engine's own defaults


def test_entry_points_keep_their_defaults_and_environment(monkeypatch):
    assert target_args([]).engine == EngineConfig("smollm2-135m-instruct", num_threads=1, kv_cache_memory_mb=512)
    draft = draft_args([]).engine
    assert (draft.model, draft.dtype, draft.num_threads, draft.kv_cache_memory_mb) == ("ngram", "float32", 1, 256)
    monkeypatch.setenv("SSD_TARGET_THREADS", "3")
    monkeypatch.setenv("SSD_TARGET_COMPILE", "off")
    monkeypatch.setenv("SSD_DRAFT_KV_MB", "32")
    assert (target_args([]).engine.num_threads, target_args([]).engine.compile) == (3, "off")
    assert target_args(["--threads", "2"]).engine.num_threads == 2  # a flag beats the environment
    assert draft_args([]).engine.kv_cache_memory_mb == 32
    generate = build_parser().parse_args(["generate", "--prompt", "hi", "--dtype", "float16"])
    assert (generate.dtype, generate.num_threads) == ("float16", None)  # ssd generate: torch's thread default
    bench = build_parser().parse_args(["bench"])
    assert bench.num_threads == 2


def test_a_bad_quantization_is_a_usage_error():
    with pytest.raises(SystemExit):
        target_args(["--quantization", "int3"])
