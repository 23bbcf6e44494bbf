"""Prefix caching across the Session with the shipped EAGLE-3 head (issue 30.1): a second chat turn through real
services hits the target's prefix cache and the draft's own, and a restarted draft (which lacks the blocks) gets
the sequence whole; the greedy text is the offline engine's every time (float32, default model)."""

import signal

import pytest

from deploy.local import respawn, stop_stack
from ssd.model_store import DEFAULT_DRAFT
from tests.integration.conftest import API_KEY, launch
from tests.integration.helpers import openai_client, scrape, target_load, wait_for

MAX_TOKENS = 24
QUESTIONS = ["Name five colours of the rainbow, separated by commas.", "Now name two more, and explain why.",
             "Which of them is your favourite?"]


def _chat(client, messages: list[dict]) -> tuple[str, int]:  # noqa: ANN001
    """One streamed greedy turn: its text and the prompt tokens served from the target's prefix cache."""
    chunks = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True, stream_options={"include_usage": True},
                                            extra_body={"mode": "sd"})
    text, cached = [], 0
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return "".join(text), cached


@pytest.mark.model
def test_second_turns_use_both_prefix_caches_and_a_restarted_draft_stays_exact(tmp_path_factory,
                                                                               default_model_path):
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    offline = LLM(str(default_model_path), dtype="float32", num_threads=1)

    def expected(messages: list[dict]) -> str:
        return offline.chat(messages, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0].text

    stack = launch(tmp_path_factory, "draft-prefix", draft=DEFAULT_DRAFT, k=4)
    try:
        target, draft = stack.target_addresses[0], stack.child("draft")
        assert wait_for(lambda: target_load(target).is_draft_connected, timeout_s=60)
        client = openai_client(stack.url, API_KEY)
        first = [{"role": "user", "content": QUESTIONS[0]}]
        answer, _ = _chat(client, first)
        assert answer == expected(first)
        history = [*first, {"role": "assistant", "content": answer}]
        second = [*history, {"role": "user", "content": QUESTIONS[1]}]
        text, cached = _chat(client, second)
        assert text == expected(second) and cached >= 16
        counters = scrape(draft.metrics_url)
        assert counters["ssd:draft_prefix_cache_hits_total"] > 0  # head positions of the shared prefix restored

        draft.proc.send_signal(signal.SIGKILL)  # a restarted draft holds no head blocks
        draft.proc.wait()
        respawn(draft)
        assert wait_for(lambda: target_load(target).is_draft_connected, timeout_s=120)
        third = [*history, {"role": "user", "content": QUESTIONS[2]}]
        text, cached = _chat(client, third)
        assert text == expected(third) and cached >= 16
        assert "lacks the sequence's prefix blocks" in (stack.config.log_dir / "target-0.log").read_text()
    finally:
        stop_stack(stack)
