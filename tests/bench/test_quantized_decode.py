"""bench.quantized_decode: a speed config builds its engine with its variants (and puts the process-wide switches
back), on the default model's own int4 weights."""

import argparse

from bench.quantized_decode import _speed_config, _speed_llm
from ssd.layers import cpu_kernels
from ssd.layers.quantized_linear import Int4Matmul
from ssd.sampling.params import SamplingParams
from ssd_kernels.cpu import extension as own_ext


def test_a_no_amx_int4_config_keeps_the_loop_and_restores_the_switch(default_model_path):
    dtype, quantization, variants = _speed_config("int4-own/no-amx")
    assert (dtype, quantization, variants) == ("bfloat16", "auto", ["no-amx"])
    llm = _speed_llm(argparse.Namespace(model=str(default_model_path)), "int4-own/no-amx", dtype, quantization,
                     threads=1, batch=8)
    int4 = [m for m in llm.engine.worker.model.modules() if isinstance(m, Int4Matmul)]
    assert int4
    assert all(m.own_bf16_path in (0, own_ext.BF16_AVX512) for m in int4)  # 0: no bfloat16 kernel on this CPU
    assert cpu_kernels._own_float == {"enabled": True, "amx": True}
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out[0].token_ids) == 2
