"""dtype "auto": bfloat16 only where the device multiplies it natively, float32 on AVX2-only CPUs."""

import pytest
import torch

from ssd import dtypes
from ssd.config import EngineConfig
from ssd.engine.llm_engine import LLMEngine
from ssd.errors import InvalidRequestError


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Set what the CPU check answers for the rest of a test."""

    def set_answer(is_native: bool) -> None:
        monkeypatch.setattr(dtypes, "cpu_has_fast_bfloat16", lambda: is_native)

    return set_answer


@pytest.mark.parametrize("is_native, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_follows_the_cpu(cpu_bf16, is_native, expected):
    cpu_bf16(is_native)
    assert dtypes.resolve_dtype_name("auto", "cpu") == expected
    assert dtypes.parse_dtype("auto") == dtypes.DTYPES[expected]


def test_auto_is_bfloat16_on_cuda(cpu_bf16):
    cpu_bf16(False)
    assert dtypes.resolve_dtype_name("auto", torch.device("cuda", 0)) == "bfloat16"


def test_explicit_names_are_kept_and_unknown_ones_refused(cpu_bf16):
    cpu_bf16(False)
    assert dtypes.resolve_dtype_name("bfloat16", "cpu") == "bfloat16"
    assert dtypes.dtype_name(torch.float32) == "float32"
    with pytest.raises(InvalidRequestError, match="unknown dtype 'fp8'"):
        dtypes.parse_dtype("fp8")
    with pytest.raises(InvalidRequestError, match="dtype must be one of auto"):
        EngineConfig(model="x", dtype="fp8")


def test_the_check_matches_onednn():
    assert dtypes.cpu_has_fast_bfloat16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.parametrize("is_native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_engine_default_loads_the_auto_dtype(tiny_llama, cpu_bf16, is_native, expected):
    cpu_bf16(is_native)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), kv_cache_memory_mb=8))
    try:
        assert engine.worker.dtype == expected
        assert next(engine.worker.model.parameters()).dtype == expected
    finally:
        engine.close()
