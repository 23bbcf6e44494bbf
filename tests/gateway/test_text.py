"""The gateway's torch-free tokenizer matches the engine's (transformers) one; stop strings; UTF-8-safe deltas."""

import pytest

from gateway.tokenizer import IncrementalDetokenizer, StopStrings, TextTokenizer

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def both(default_model_path):
    from ssd.tokenizer import Tokenizer
    from target_service.tokenizer_files import read_tokenizer_files

    return TextTokenizer(read_tokenizer_files(default_model_path)), Tokenizer(default_model_path)


MESSAGES = [
    [{"role": "user", "content": "Hello, who are you?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Café ☕ and 日本語?"}],
]


@pytest.mark.parametrize("messages", MESSAGES)
def test_chat_template_and_encoding_match_transformers(both, messages):
    ours, theirs = both
    text = ours.chat_prompt(messages)
    assert text == theirs.apply_chat_template(messages)
    assert ours.encode(text) == theirs.encode(text)


def test_decode_matches_transformers(both):
    ours, theirs = both
    ids = theirs.encode("  Spaces, émojis 🎉 and code:\n\tdef f(x): return x ** 2  ") + [2, 1]
    assert ours.decode(ids) == theirs.decode(ids)


def test_incremental_detokenizer_never_splits_a_character(both):
    ours, _ = both
    text = "emoji 🎉🎉 and 日本語 done"
    ids = ours.encode(text)
    detok = IncrementalDetokenizer(ours)
    deltas = [detok.push([t]) for t in ids]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_strings_cut_before_the_stop_across_deltas():
    s = StopStrings(["###", "END"])
    out = [s.push(d) for d in ["Hello wor", "ld #", "#", "# more"]]
    assert "".join(out) == "Hello world " and s.is_stopped
    s = StopStrings(["END"])
    assert s.push("no stop E") + s.push("N", is_last=True) == "no stop EN" and not s.is_stopped
    s = StopStrings([])
    assert s.push("abc") == "abc"


def test_included_stop_strings_end_the_text_after_the_first_stop():
    s = StopStrings(["###", "END"], include=True)
    out = [s.push(d) for d in ["Hello wor", "ld #", "#", "# more END"]]
    assert "".join(out) == "Hello world ###" and s.is_stopped
    s = StopStrings(["a", "ab", "b"], include=True)  # two stops start at the same place: the longer one
    assert s.push("xxabc") == "xxab"


def test_logprobs_in_both_openai_shapes(both):
    from gateway.logprobs_format import chat_logprobs, completion_logprobs
    from protos.ssd.v1 import common_pb2

    ours, _ = both
    ids = ours.encode("Hello world")
    eos = ours.encode(ours.eos_token) if ours.eos_token else []
    entries = [common_pb2.TokenLogprob(token_id=t, logprob=-0.5, top_token_ids=[t, 0], top_logprobs=[-0.5, -2.0])
               for t in ids + eos]
    chat = chat_logprobs(ours, entries)["content"]
    assert "".join(e["token"] for e in chat[: len(ids)]) == "Hello world"
    assert [e["token"] for e in chat[len(ids) :]] == [ours.eos_token] * len(eos)  # special tokens are named
    assert all(bytes(e["bytes"]).decode() == e["token"] for e in chat)
    assert [t["logprob"] for t in chat[0]["top_logprobs"]] == [-0.5, -2.0]
    comp = completion_logprobs(ours, entries[: len(ids)], text_offset=3)
    assert "".join(comp["tokens"]) == "Hello world" and comp["token_logprobs"] == [-0.5] * len(ids)
    assert comp["text_offset"][0] == 3 and comp["text_offset"] == sorted(comp["text_offset"])
    assert all(len(top) == 2 for top in comp["top_logprobs"])
