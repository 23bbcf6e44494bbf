"""OpenAI sampling options through the real services: `n` concurrent choices (choice i reproducing a single
request seeded seed + i, usage summed), `best_of` (the likeliest of the seeded candidates), and presence / frequency penalties with a logit bias giving the offline
engine's answer."""

import pytest

from tests.integration.conftest import API_KEY
from tests.integration.helpers import openai_client

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Name a color."}]


def test_n_choices_match_single_requests_seeded_apart(stack):
    client = openai_client(stack.url, API_KEY)
    sampling = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0,
                "extra_body": {"mode": "ar"}}
    many = client.chat.completions.create(n=3, seed=11, **sampling)
    assert [c.index for c in many.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(seed=11 + i, **sampling) for i in range(3)]
    assert [c.message.content for c in many.choices] == [s.choices[0].message.content for s in singles]
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens

    chunks = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, n=2, stream=True,
                                       temperature=0)
    texts = ["", ""]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts[0] == texts[1] != ""  # greedy: both choices are the same answer


def test_best_of_returns_the_candidate_with_the_highest_mean_logprob(stack):
    client = openai_client(stack.url, API_KEY)
    sampling = {"model": MODEL, "prompt": "My favourite animal is", "max_tokens": 8, "temperature": 1.0,
                "logprobs": 0, "extra_body": {"mode": "ar", "ignore_eos": True}}
    singles = [client.completions.create(seed=3 + i, **sampling).choices[0] for i in range(3)]
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in singles]
    best = client.completions.create(best_of=3, seed=3, **sampling)
    assert len(best.choices) == 1
    assert best.choices[0].text == singles[means.index(max(means))].text
    assert best.usage.completion_tokens == 3 * 8


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_vllm_extensions_through_the_services_equal_the_offline_engine(stack, offline_greedy, mode):
    from ssd.sampling.params import SamplingParams

    llm = offline_greedy.llm
    prompt = "Count: one, two, three,"
    free = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=30))[0].token_ids
    params = SamplingParams(temperature=0.0, max_tokens=30, repetition_penalty=1.3, min_tokens=20,
                            stop_token_ids=(free[1],))
    expected = llm.generate(prompt, params)[0]
    assert expected.token_ids != free and len(expected.token_ids) >= 20
    client = openai_client(stack.url, API_KEY)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0,
                                      extra_body={"mode": mode, "repetition_penalty": 1.3, "min_tokens": 20,
                                                  "stop_token_ids": [free[1]], "min_p": 0.2})
    assert reply.choices[0].text == expected.text  # min_p does not change a greedy answer


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_penalties_and_bias_through_the_services_equal_the_offline_engine(stack, offline_greedy, mode):
    from ssd.sampling.params import SamplingParams

    prompt = "List five fruits, one per line."
    llm = offline_greedy.llm
    chat = llm.chat_prompt([{"role": "user", "content": prompt}])
    first = llm.generate(chat, SamplingParams(temperature=0.0, max_tokens=1))[0].token_ids[0]
    params = SamplingParams(temperature=0.0, max_tokens=40, presence_penalty=1.2, frequency_penalty=0.8,
                            logit_bias={first: -100})  # the unbiased first token is banned
    expected = llm.generate(chat, params)[0].text
    assert expected != offline_greedy(prompt, 40)
    client = openai_client(stack.url, API_KEY)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=40, temperature=0, presence_penalty=1.2,
                                           frequency_penalty=0.8, logit_bias={str(first): -100},
                                           extra_body={"mode": mode})
    assert reply.choices[0].message.content == expected
