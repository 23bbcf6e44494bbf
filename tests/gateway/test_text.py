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
