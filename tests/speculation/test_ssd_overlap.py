"""In-process SSD overlaps for real: the speculator's worker builds the next cache while the target verifies.

The target's forwards are slowed by a sleep so the check does not depend on how fast these tiny models run;
what is asserted is the order of events (builds start before the verify of their round has ended), never a
duration."""

import threading
import time

import pytest

from ssd.config import ProposerChoice, SpeculationConfig, SsdConfig
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from ssd.speculation.speculator_worker import OverlappedSpeculator, SpeculatorWorker
from tests.speculation.test_eagle3_sd import tiny_target_draft_and_head
from tests.speculation.test_sd_greedy import PARAMS, PROMPTS


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_target_draft_and_head(tmp_path_factory)


def _ssd_llm(target, draft) -> LLM:  # noqa: ANN001
    spec = SpeculationConfig(ProposerChoice(str(draft)), num_speculative_tokens=3, ssd=SsdConfig())
    return LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)


@pytest.mark.parametrize("which", ["draft_model", "eagle3"])
def test_build_runs_while_the_target_verifies(models, which):
    target, draft, head = models
    llm = _ssd_llm(target, draft if which == "draft_model" else head)
    proposer = llm.engine.speculative_decoder.proposer
    assert isinstance(proposer, OverlappedSpeculator)
    verify_windows: list[tuple[float, float]] = []
    forward = llm.engine.runner.forward

    def slow_forward(items, mode, aux_layers=()):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        time.sleep(0.03)  # a target step that takes a while, as a big target's would
        out = forward(items, mode, aux_layers)
        verify_windows.append((started, time.perf_counter()))
        return out

    llm.engine.runner.forward = slow_forward
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert len(out.token_ids) == 24
    builds = list(proposer.worker.build_windows)
    assert len(builds) >= 3
    # A build starts right after its answer, and the verify of that round starts after the answer too: the build
    # begins inside a verify window (it overlaps the target's forward) instead of after it.
    inside = [any(v0 <= b0 < v1 for v0, v1 in verify_windows) for b0, _ in builds]
    assert sum(inside) >= len(builds) - 1, (builds, verify_windows)
    assert proposer.worker.num_failed_builds == 0


def test_overlapped_greedy_equals_ar_in_a_batch(models):
    target, draft, _ = models
    ar = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    expected = [ar.generate([p], PARAMS)[0].token_ids for p in PROMPTS]
    llm = _ssd_llm(target, draft)
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == expected
    assert llm.engine.speculative_decoder.counters.num_cache_hits > 0


def test_worker_runs_calls_in_order_on_one_thread():
    worker = SpeculatorWorker()
    seen: list[tuple[int, str]] = []
    for i in range(5):
        worker.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert worker.call(lambda: len(seen)) == 5  # queued behind the five
    assert [i for i, _ in seen] == list(range(5)) and len({name for _, name in seen}) == 1
    worker.submit_build(lambda job: 1 / 0, None)  # a failed build is logged and counted, never raised
    worker.call(lambda: None)
    assert worker.num_failed_builds == 1
    worker.close()
