"""Target and EAGLE-3 draft services on one GPU: target features cross the session by CUDA IPC handle, and
greedy output through the services equals the engine's own AR on that GPU.

Needs a CUDA GPU (skipped elsewhere). Real processes on localhost; tiny random float32 models in tmp.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch

from deploy.local import free_port, spawn, stop_child, wait_healthy
from protos.ssd.v1 import common_pb2, target_pb2, target_pb2_grpc
from tests.speculation.test_eagle3_sd import PROMPTS, tiny_target_and_head

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MAX_TOKENS = 24


def generate(address: str, prompt: list[int], temperature: float = 0.0) -> list[target_pb2.VerifierGenerateResponse]:
    """Every message of one sd request (tokens, then the finish with its speculation stats)."""
    params = common_pb2.SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, ignore_eos=True, seed=7)
    request = target_pb2.VerifierGenerateRequest(prompt_token_ids=prompt, params=params,
                                                 mode=common_pb2.SPECULATION_MODE_SD)
    with grpc.insecure_channel(address) as channel:
        return list(target_pb2_grpc.VerifierStub(channel).Generate(request, timeout=120))


def session_opened(log: Path, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "tensor transport" in log.read_text():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


@pytest.fixture(scope="module")
def services(folders, tmp_path_factory):
    """(target address, log folder): both services with --device cuda, the session open."""
    target, head = folders
    logs = tmp_path_factory.mktemp("logs-cuda")
    draft_address, target_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    common = ["--dtype", "float32", "--device", "cuda", "--threads", "1"]
    draft = spawn("draft", ["draft_service", "--draft", str(head), "--target-model", str(target),
                            "--address", draft_address, *common], draft_address, None, logs)
    server = spawn("target", ["target_service", "--model", str(target), "--address", target_address, "--k", "3",
                              "--draft-address", draft_address, *common], target_address, None, logs)
    try:
        wait_healthy([draft, server], 180)
        assert session_opened(logs / "draft.log")
        yield target_address, logs
    finally:
        stop_child(server)
        stop_child(draft)


def test_features_travel_by_cuda_ipc_and_greedy_output_equals_ar_on_the_gpu(folders, services):
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    target_address, logs = services
    assert "TENSOR_TRANSPORT_CUDA_IPC" in (logs / "draft.log").read_text()
    ar = LLM(str(folders[0]), dtype="float32", device="cuda", block_size=4, kv_cache_memory_mb=8)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [ar.generate([p], params)[0].token_ids for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: rounds carry several sequences
        results = list(pool.map(lambda p: generate(target_address, p), PROMPTS))
    assert [[t for m in messages for t in m.token_ids] for messages in results] == expected
    assert sum(messages[-1].spec.num_draft_tokens for messages in results) > 0


def test_sampled_requests_complete_on_the_gpu(services):
    """At temperature > 0 the draft's q comes back too (host shared memory beside CUDA IPC)."""
    target_address, _ = services
    messages = generate(target_address, PROMPTS[0], temperature=0.8)
    assert sum(len(m.token_ids) for m in messages) == MAX_TOKENS
    assert messages[-1].spec.num_draft_tokens > 0
