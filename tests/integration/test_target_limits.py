"""Back-pressure and deadlines at the target: past its queue a request is RESOURCE_EXHAUSTED; a request whose
deadline passes is DEADLINE_EXCEEDED and its KV is freed."""

import grpc
import pytest

from deploy.local import free_port, spawn, stop_child, wait_healthy
from protos.ssd.v1 import common_pb2, target_pb2, target_pb2_grpc
from tests.integration.helpers import target_load, wait_for

pytestmark = pytest.mark.model

PROMPT = list(range(100, 140))


@pytest.fixture(scope="module")
def target(tmp_path_factory, default_model_path):
    address = f"127.0.0.1:{free_port()}"
    child = spawn("target-limits", ["target_service", "--model", str(default_model_path), "--address", address,
                                    "--default-mode", "ar", "--max-num-seqs", "1", "--max-waiting-seqs", "1",
                                    "--threads", "1"], address, None, tmp_path_factory.mktemp("logs-limits"))
    try:
        wait_healthy([child], 180)
        yield address
    finally:
        stop_child(child)


def _request(request_id: str, max_tokens: int) -> target_pb2.VerifierGenerateRequest:
    return target_pb2.VerifierGenerateRequest(
        request_id=request_id, prompt_token_ids=PROMPT,
        params=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def test_past_the_queue_a_request_is_resource_exhausted(target):
    with grpc.insecure_channel(target) as ch:
        stub = target_pb2_grpc.VerifierStub(ch)
        running = stub.Generate(_request("a", 2000), timeout=120)
        next(running)  # admitted and running
        waiting = stub.Generate(_request("b", 2000), timeout=120)  # the one waiting place
        assert wait_for(lambda: target_load(target).num_sequences == 2, timeout_s=30)
        with pytest.raises(grpc.RpcError) as e:
            next(stub.Generate(_request("c", 4), timeout=60))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "full" in e.value.details()
        running.cancel()
        waiting.cancel()
    assert wait_for(lambda: target_load(target).num_used_kv_blocks == 0, timeout_s=30)


def test_a_deadline_expires_and_frees_the_kv(target):
    assert wait_for(lambda: target_load(target).num_used_kv_blocks == 0, timeout_s=30)
    with grpc.insecure_channel(target) as ch:
        with pytest.raises(grpc.RpcError) as e:
            for _ in target_pb2_grpc.VerifierStub(ch).Generate(_request("slow", 4000), timeout=1.5):
                pass
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_for(lambda: target_load(target).num_sequences == 0 and target_load(target).num_used_kv_blocks == 0,
                    timeout_s=30)
