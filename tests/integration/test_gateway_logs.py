"""At the default log level the gateway's log holds neither API keys (good or bad) nor prompt text, whatever the
request's fate (served, refused, failed validation, over gRPC or HTTP). Real gateway process, fake target."""

import grpc
import httpx

from protos.ssd.v1 import gateway_pb2, gateway_pb2_grpc
from tests.integration.gateway_stack import API_KEY, AUTH, fake_stack

SECRET = "zebra-quartz-7731"  # in every prompt: it must never reach the log
WRONG_KEY = "wrong-key-5519"


def test_keys_and_prompts_stay_out_of_the_log(tmp_path, default_model_path):
    with fake_stack(tmp_path, default_model_path) as s:
        chat = {"messages": [{"role": "user", "content": f"tell me {SECRET}"}], "max_tokens": 2}
        bodies = [chat, {**chat, "temperature": 9}, {**chat, "max_tokens": 2**40}, {"prompt": SECRET * 5000},
                  {**chat, "messages": [{"role": "wizard", "content": SECRET}]}]
        for body in bodies:
            for path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
                httpx.post(s.url + path, json=body, headers=AUTH, timeout=30)
        httpx.post(s.url + "/v1/completions", json={"prompt": SECRET}, timeout=30,
                   headers={"Authorization": f"Bearer {WRONG_KEY}"})
        with grpc.insecure_channel(s.grpc_address) as ch:
            stub = gateway_pb2_grpc.GenerationStub(ch)
            for md_key in (API_KEY, WRONG_KEY):
                for req in (gateway_pb2.GenerateRequest(prompt=SECRET, max_tokens=2),
                            gateway_pb2.GenerateRequest(prompt=SECRET, max_tokens=2, top_k=-1),
                            gateway_pb2.GenerateRequest(prompt=SECRET * 10000)):
                    try:
                        stub.Generate(req, metadata=(("authorization", f"Bearer {md_key}"),), timeout=30)
                    except grpc.RpcError:
                        pass
        log = s.log_path.read_text()
    assert "request failed" in log and "finished" in log  # the log is written at all
    for secret in (SECRET, API_KEY, WRONG_KEY):
        assert secret not in log
