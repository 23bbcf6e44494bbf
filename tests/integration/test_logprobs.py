"""Token logprobs through the real services: the OpenAI client and the gateway's gRPC API get one entry per
generated token, and (float32 target) the same numbers whether the tokens came from plain decoding or from
speculative rounds."""

import grpc
import pytest

from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.conftest import API_KEY, MAX_TOKENS, PROMPTS
from tests.integration.helpers import openai_client

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"


def test_chat_logprobs_are_the_same_in_ar_and_sd(stack, offline_greedy):
    client = openai_client(stack.url, API_KEY)
    replies = {mode: client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": PROMPTS[1]}],
        logprobs=True, top_logprobs=3, extra_body={"mode": mode}) for mode in ("ar", "sd")}
    for reply in replies.values():
        choice = reply.choices[0]
        assert choice.message.content == offline_greedy(PROMPTS[1])
        content = choice.logprobs.content
        assert len(content) == reply.usage.completion_tokens
        for entry in content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            assert entry.top_logprobs[0].token == entry.token  # greedy takes the most likely token
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    ar, sd = (replies[m].choices[0].logprobs.content for m in ("ar", "sd"))
    assert [e.token for e in sd] == [e.token for e in ar]
    assert [e.logprob for e in sd] == pytest.approx([e.logprob for e in ar], abs=1e-3)

    chunks = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": PROMPTS[1]}],
        logprobs=True, stream=True, extra_body={"mode": "sd"})
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in ar]
    assert all(e.top_logprobs == [] for e in streamed)


def test_streamed_completion_logprobs_cover_every_token(stack):
    client = openai_client(stack.url, API_KEY)
    chunks = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                                       logprobs=2, stream=True, stream_options={"include_usage": True})
    tokens, offsets, text, used = [], [], [], None
    for chunk in chunks:
        if chunk.choices:
            text.append(chunk.choices[0].text)
            lp = chunk.choices[0].logprobs
            if lp is not None:
                tokens += lp.tokens
                offsets += lp.text_offset
                assert all(len(top) <= 2 for top in lp.top_logprobs)
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    assert used and len(tokens) == used
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert "".join(tokens).startswith("".join(text).rstrip())


def test_grpc_gateway_returns_logprobs(stack):
    with grpc.insecure_channel(stack.grpc_address) as ch:
        stub = gateway_pb2_grpc.GenerationStub(ch)
        req = gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=6, logprobs=1,
                                          mode=common_pb2.SPECULATION_MODE_SD)
        md = (("authorization", f"Bearer {API_KEY}"),)
        parts = list(stub.GenerateStream(req, metadata=md, timeout=120))
        entries = [lp for p in parts for lp in p.logprobs]
        assert [lp.token_id for lp in entries] == [t for p in parts for t in p.token_ids]
        assert all(len(lp.top_token_ids) == 1 and lp.logprob <= 0 for lp in entries)
        whole = stub.Generate(req, metadata=md, timeout=120)
        assert [lp.token_id for lp in whole.logprobs] == [lp.token_id for lp in entries]
        assert not whole.prompt_logprobs
        req.prompt_logprobs = 0
        whole = stub.Generate(req, metadata=md, timeout=120)
        parts = list(stub.GenerateStream(req, metadata=md, timeout=120))
        prompt_ids = [lp.token_id for lp in whole.prompt_logprobs]
        assert len(prompt_ids) >= 3 and all(lp.logprob <= 0 for lp in whole.prompt_logprobs)
        assert [lp.token_id for lp in parts[0].prompt_logprobs] == prompt_ids
        assert all(not p.prompt_logprobs for p in parts[1:])


def test_echo_scores_the_prompt_like_the_offline_engine(stack, offline_greedy):
    from ssd.sampling.params import SamplingParams

    prompt = "The capital of France is Paris."
    llm = offline_greedy.llm
    ids = llm.tokenizer.encode(prompt)
    expected = llm.generate(ids, SamplingParams(max_tokens=1, prompt_logprobs=1))[0].prompt_logprobs
    client = openai_client(stack.url, API_KEY)
    for mode in ("ar", "sd"):
        reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                          extra_body={"mode": mode})
        choice = reply.choices[0]
        assert choice.text == prompt and reply.usage.completion_tokens == 0
        lp = choice.logprobs
        assert "".join(lp.tokens) == prompt and lp.token_logprobs[0] is None
        assert lp.token_logprobs[1:] == pytest.approx([e.logprob for e in expected], abs=1e-4)
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    answered = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert answered.choices[0].text.startswith(prompt) and len(answered.choices[0].text) > len(prompt)

    # what an evaluation harness sends for log-likelihoods: a batch of token-id prompts, echoed and scored
    other = llm.tokenizer.encode("Two plus two is four.")
    batch = client.completions.create(model=MODEL, prompt=[ids, other], max_tokens=1, echo=True, logprobs=1,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text.startswith(prompt)
    assert batch.choices[0].logprobs.token_logprobs[1 : len(ids)] == pytest.approx(
        [e.logprob for e in expected], abs=1e-4)
    assert len(batch.choices[1].logprobs.tokens) == len(other) + 1  # the prompt's tokens, then the answer's one
    assert batch.usage.prompt_tokens == len(ids) + len(other)
