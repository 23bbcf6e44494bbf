"""`ssd bench --against URL` on our own gateway gives the in-process run's outputs (text hash)."""

import pytest

from bench.against import AgainstSettings, render_texts, run_against
from bench.datasets import load_prompts
from bench.runner import BenchSettings, run_benchmarks
from tests.integration.conftest import API_KEY

pytestmark = pytest.mark.model

OUTPUT_LEN = 8  # short enough that no answer reaches EOS (the gateway has no ignore_eos)


def test_against_gateway_matches_in_process(stack) -> None:  # noqa: ANN001
    prompts = load_prompts("mtbench", 2)
    base = BenchSettings(mode="ar", model="smollm2-135m-instruct", dataset="mtbench", output_len=OUTPUT_LEN,
                         batch=1, temperature=0.0, dtype="float32", threads=1, warmup=0)
    local = run_benchmarks(base, ["ar"], [1], prompts)[0]
    texts = render_texts("smollm2-135m-instruct", prompts)
    for mode in ("ar", "sd"):
        s = AgainstSettings(url=stack.url, model=None, api_key=API_KEY, output_len=OUTPUT_LEN, temperature=0.0,
                            mode=mode)
        remote = run_against(s, texts, warmup=0)
        assert remote["num_stopped_early"] == 0
        assert remote["output_tokens"] == OUTPUT_LEN * len(prompts)
        assert remote["outputs_text_sha256"] == local["outputs_text_sha256"], mode
        assert remote["decode_tok_s"] > 0 and remote["ttft_s"] > 0
