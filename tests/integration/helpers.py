"""Small clients for the integration tests: gRPC stubs, load polling, the openai client."""

import time

import grpc
from openai import OpenAI

from protos.ssd.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc


def openai_client(url: str, api_key: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=120)


def target_load(address: str) -> common_pb2.Load:
    with grpc.insecure_channel(address) as ch:
        return target_pb2_grpc.VerifierStub(ch).GetLoad(common_pb2.LoadRequest(), timeout=5)


def draft_load(address: str) -> common_pb2.Load:
    with grpc.insecure_channel(address) as ch:
        return draft_pb2_grpc.SpeculatorStub(ch).GetLoad(common_pb2.LoadRequest(), timeout=5)


def wait_for(predicate, timeout_s: float = 20.0, interval_s: float = 0.2) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def stream_chat(client: OpenAI, prompt: str, max_tokens: int, mode: str | None = None,
                ignore_eos: bool = False) -> tuple[str, dict | None]:
    extra = ({"mode": mode} if mode else {}) | ({"ignore_eos": True} if ignore_eos else {})
    chunks = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=extra or None)
    text, usage = [], None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    return "".join(text), usage


def scrape(url: str) -> dict[str, float]:
    """A /metrics page parsed with prometheus_client's parser: sample name -> value summed over its labels."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def stack_config(**options: object) -> "StackConfig":  # noqa: F821 - deploy.local imported here only
    """A StackConfig from flat options: EngineConfig's fields go to the targets' engine, the rest to the stack."""
    from dataclasses import fields

    from deploy.local import StackConfig
    from ssd.config import EngineConfig

    names = {f.name for f in fields(EngineConfig)}
    engine = {k: v for k, v in options.items() if k in names}
    return StackConfig(EngineConfig(**engine), **{k: v for k, v in options.items() if k not in names})
