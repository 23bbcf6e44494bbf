"""vLLM's /tokenize and /detokenize on the HTTP bridge (stub generator, the letter tokenizer): prompts and chat
messages (through the template) to token ids and back, guarded like /v1/, bad bodies and other models refused;
and vLLM's chat-template options (add_generation_prompt, continue_final_message, chat_template_kwargs)."""

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from gateway.tokenizer import TextTokenizer
from protos.ssd.v1 import target_pb2
from tests.gateway.test_http_asgi import HEADERS, StubGenerator, _post, make_app
from tests.letter_models import write_letter_tokenizer

TEMPLATE = ("{% if shout %}m{% endif %}{% for m in messages %}{{ m.content }}k{% endfor %}"
            "{% if add_generation_prompt %}n{% endif %}")  # k ends a turn, n opens the assistant's


@pytest.fixture(scope="module")
def generator(tmp_path_factory) -> StubGenerator:  # noqa: ANN001
    folder = tmp_path_factory.mktemp("letter-tokenizer")
    write_letter_tokenizer(folder)
    files = target_pb2.TokenizerFiles(tokenizer_json=(folder / "tokenizer.json").read_bytes(), chat_template=TEMPLATE)
    gen = StubGenerator()
    tokenizer = TextTokenizer(files)
    gen.tokenizer = lambda: tokenizer
    gen.router = SimpleNamespace(replicas=[], info=lambda: SimpleNamespace(max_model_len=64, vocab_size=16))
    return gen


def _call(gen, path: str, body: dict, headers: dict | None = None) -> httpx.Response:  # noqa: ANN001
    return asyncio.run(_post(make_app(gen), json.dumps(body).encode(), path, headers))


def test_a_prompt_and_chat_messages_become_the_token_ids_the_target_would_see(generator):
    r = _call(generator, "/tokenize", {"prompt": "abc"})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 3, "max_model_len": 64, "tokens": [2, 3, 4]}
    r = _call(generator, "/tokenize", {"model": "stub", "messages": [{"role": "user", "content": "ab"},
                                                                      {"role": "assistant", "content": "c"}]})
    assert r.json()["tokens"] == [2, 3, 12, 4, 12, 15]  # "ab" k "c" k, then the generation prompt "n"


def test_detokenize_reverses_tokenize(generator):
    r = _call(generator, "/detokenize", {"tokens": [2, 3, 4, 1]})  # </s> is special: skipped, as in answers
    assert r.status_code == 200 and r.json() == {"prompt": "abc"}


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/tokenize", {}, 400),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404),
    ("/detokenize", {"tokens": [-1]}, 400),
    ("/detokenize", {"tokens": [2, 16]}, 400),  # past the vocabulary
    ("/detokenize", {"tokens": "abc"}, 400),
])
def test_bad_bodies_and_other_models_are_refused(generator, path, body, status):
    r = _call(generator, path, body)
    assert r.status_code == status and r.json()["error"]["message"]


def test_tokenize_needs_the_api_key(generator):
    r = _call(generator, "/tokenize", {"prompt": "a"}, {k: v for k, v in HEADERS.items() if k != "Authorization"})
    assert r.status_code == 401


CHAT = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]


@pytest.mark.parametrize(("options", "tokens"), [
    ({"add_generation_prompt": False}, [2, 3, 12, 4, 5, 12]),
    ({"add_generation_prompt": False, "continue_final_message": True}, [2, 3, 12, 4, 5]),  # the answer goes on "cd"
    ({"chat_template_kwargs": {"shout": True}}, [14, 2, 3, 12, 4, 5, 12, 15]),
])
def test_chat_template_options_shape_the_prompt(generator, options, tokens):
    r = _call(generator, "/tokenize", {"messages": CHAT, **options})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tokens


@pytest.mark.parametrize(("options", "message"), [
    ({"continue_final_message": True}, "add_generation_prompt: false"),
    ({"add_generation_prompt": False, "continue_final_message": True, "messages": CHAT[:1]}, "assistant"),
    ({"chat_template_kwargs": {"messages": []}}, "may not set messages"),
])
def test_inconsistent_chat_template_options_are_400s(generator, options, message):
    for path in ("/tokenize", "/v1/chat/completions"):
        r = _call(generator, path, {"messages": CHAT, "max_tokens": 4, **options})
        assert r.status_code == 400 and message in r.json()["error"]["message"], (path, r.json())


def test_chat_completions_hand_the_options_to_the_prompt(generator):
    generator.requests.clear()
    body = {"messages": CHAT, "max_tokens": 4, "add_generation_prompt": False, "continue_final_message": True,
            "chat_template_kwargs": {"shout": True}}
    assert _call(generator, "/v1/chat/completions", body).status_code == 200
    render = generator.requests[-1].render
    assert not render.add_generation_prompt and render.continue_final_message
    assert render.template_kwargs == {"shout": True}


def test_models_carry_max_model_len_and_version_answers(generator):
    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=make_app(generator))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get(path, headers=HEADERS)

    (model,) = asyncio.run(get("/v1/models")).json()["data"]
    assert model["id"] == "stub" and model["max_model_len"] == 64
    assert asyncio.run(get("/version")).json()["version"]
