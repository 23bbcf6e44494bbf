"""bench/ssd_build.py on the default model and the shipped head: the speculator's worker runs inline, so every round
builds a cache right after its answer, and both build and verify get timed."""

import pytest

from bench.ssd_build import InlineWorker, serial_ssd_llm, time_case
from ssd.model_store import DEFAULT_DRAFT

pytestmark = pytest.mark.model


def test_builds_run_inline_and_both_sides_are_timed(default_model_path):
    llm = serial_ssd_llm(str(default_model_path), DEFAULT_DRAFT, k=2, dtype="float32")
    worker = llm.engine.speculative_decoder.proposer.worker
    assert isinstance(worker, InlineWorker)
    case = time_case(llm, batch=2, temperature=0.0, output_len=6)
    assert case["rounds"] > 0 and case["build_ms"] > 0 and case["verify_ms"] > 0
    assert len(worker.build_windows) >= case["rounds"] and worker.num_failed_builds == 0
