"""Which paths the server answers and how: unknown paths are 404 in OpenAI's error shape for
every method, a known path asked with another method is 405 naming the methods it takes,
`GET /v1/models/{id}`, vLLM's `/tokenize` and `/detokenize`, and random response ids."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from baton.core.text.tokenizer import Tokenizer
from tests.server_harness import base_url, running_server, simulated_engine

# A hub-style name: its slash is part of `/v1/models/{id}`'s path.
MODEL = "org/tiny"
KEY = "sk-routes"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a for statement?"},
]


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    with running_server(simulated_engine(llama_checkpoint), model_name=MODEL) as state:
        yield base_url(state)


@pytest.fixture(scope="module")
def tokenizer(llama_checkpoint) -> Tokenizer:
    return Tokenizer.from_pretrained(llama_checkpoint)


def assert_error(response: httpx.Response, status: int, kind: str, param: str | None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind and body["error"]["param"] == param
    return body["error"]["message"]


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"])
@pytest.mark.parametrize(
    "path", ["/v1/audio/speech", "/tokenizer", "/v1/chat/completions/x", "/a/b"]
)
def test_an_unknown_path_is_a_404_in_openai_shape_for_every_method(server, method, path):
    response = httpx.request(method, server + path, json={} if method != "HEAD" else None)
    if method == "HEAD":
        assert response.status_code == 404  # a HEAD answer has no body to read
        return
    message = assert_error(response, 404, "not_found_error", None)
    assert f"{method} {path}" in message


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/tokenize", "POST"),
        ("PUT", "/detokenize", "POST"),
        ("DELETE", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET, HEAD"),
        ("POST", "/health", "GET, HEAD"),
        ("POST", "/", "GET, HEAD"),
    ],
)
def test_a_known_path_with_another_method_is_a_405_naming_the_methods_it_takes(
    server, method, path, allowed
):
    response = httpx.request(method, server + path)
    message = assert_error(response, 405, "invalid_request_error", None)
    # Starlette keeps a route's methods in a set: their order varies between runs.
    assert set(response.headers["allow"].split(", ")) == set(allowed.split(", "))
    assert method in message and response.headers["allow"] in message


def test_the_chat_ui_is_still_served_at_the_root(server):
    page = httpx.get(server + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_a_model_is_retrieved_by_id_through_the_openai_client(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="none")
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model" and card.owned_by == "baton"
    assert card.model_dump()["max_model_len"] == 4096
    assert client.models.list().data[0].id == card.id
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.body["code"] == "model_not_found"
    assert "gpt-4" in missing.value.body["message"] and MODEL in missing.value.body["message"]


def test_tokenize_a_prompt_in_vllms_shape(server, tokenizer):
    text = "The for statement repeats a block."
    response = httpx.post(server + "/tokenize", json={"model": MODEL, "prompt": text})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body == {
        "count": len(tokenizer.encode(text)),
        "max_model_len": 4096,
        "tokens": tokenizer.encode(text),
        "token_strs": None,
    }
    assert body["tokens"][0] == tokenizer.bos_token_id
    bare = httpx.post(
        server + "/tokenize",
        json={"prompt": text, "add_special_tokens": False, "return_token_strs": True},
    ).json()
    assert bare["tokens"] == body["tokens"][1:] and bare["count"] == body["count"] - 1
    assert bare["token_strs"] == tokenizer.convert_ids_to_tokens(bare["tokens"])


def test_tokenize_takes_the_chat_templates_fields_as_chat_completions_does(server):
    # A continued final message and template variables: /tokenize counts what the chat
    # endpoint would run, so a client can trim to fit with either.
    messages = [*MESSAGES, {"role": "assistant", "content": "It is"}]
    extra = {
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    counted = httpx.post(server + "/tokenize", json={"messages": messages, **extra}).json()
    client = openai.OpenAI(base_url=server + "/v1", api_key="none")
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body=extra
    )

    assert counted["count"] == chat.usage.prompt_tokens


def test_tokenize_messages_counts_the_prompt_tokens_chat_completions_runs(server, tokenizer):
    counted = httpx.post(server + "/tokenize", json={"messages": MESSAGES}).json()
    client = openai.OpenAI(base_url=server + "/v1", api_key="none")
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert counted["count"] == chat.usage.prompt_tokens
    assert counted["tokens"] == tokenizer.encode_chat(MESSAGES)
    # Without the assistant's opening the template ends after the last message.
    unprompted = httpx.post(
        server + "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}
    ).json()
    assert 0 < unprompted["count"] < counted["count"]
    assert counted["tokens"][: unprompted["count"]] == unprompted["tokens"]


def test_detokenize_gives_back_the_text_tokenize_was_given(server, tokenizer):
    text = "Loops: for, while."
    tokens = httpx.post(server + "/tokenize", json={"prompt": text}).json()["tokens"]
    response = httpx.post(server + "/detokenize", json={"model": MODEL, "tokens": tokens})
    assert response.status_code == 200, response.text
    # Special tokens are kept, as vLLM keeps them: the BOS the tokenizer added comes back.
    assert response.json() == {"prompt": tokenizer.special_tokens["bos_token"] + text}
    chat = httpx.post(server + "/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    rendered = httpx.post(server + "/detokenize", json={"tokens": chat}).json()["prompt"]
    assert rendered == tokenizer.apply_chat_template(MESSAGES)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "hint"),
    [
        ("/tokenize", {}, 400, "prompt", "required"),
        ("/tokenize", {"prompt": 5}, 400, "prompt", "string"),
        ("/tokenize", {"prompt": "x", "stream": True}, 400, "stream", "not supported"),
        ("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, "model", "gpt-4"),
        ("/tokenize", {"messages": []}, 400, "messages", "empty"),
        ("/tokenize", {"messages": [{"content": "x"}]}, 400, "messages[0].role", "required"),
        (
            "/tokenize",
            {"messages": MESSAGES, "continue_final_message": True},
            400,
            "continue_final_message",
            "add_generation_prompt: false",
        ),
        ("/detokenize", {}, 400, "tokens", "required"),
        ("/detokenize", {"tokens": [1, "a"]}, 400, "tokens[1]", "integer"),
        ("/detokenize", {"tokens": [5, 512]}, 400, "tokens[1]", "vocabulary [0, 512)"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]", "vocabulary"),
        ("/detokenize", {"tokens": [5], "model": "gpt-4"}, 404, "model", "gpt-4"),
    ],
)
def test_bad_tokenize_bodies_are_refused_naming_the_field(server, path, body, status, param, hint):
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    message = assert_error(httpx.post(server + path, json=body), status, kind, param)
    assert hint in message


def test_tokenize_and_detokenize_need_the_key_and_refuse_other_sites(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    with running_server(engine, model_name=MODEL, api_keys=[KEY]) as state:
        url = base_url(state)
        bodies = {"/tokenize": {"prompt": "hi"}, "/detokenize": {"tokens": [5]}}
        for path, body in bodies.items():
            assert_error(httpx.post(url + path, json=body), 401, "authentication_error", None)
            keyed = {"Authorization": f"Bearer {KEY}"}
            assert httpx.post(url + path, json=body, headers=keyed).status_code == 200
            foreign = {**keyed, "Origin": "https://elsewhere.example"}
            refused = httpx.post(url + path, json=body, headers=foreign)
            assert_error(refused, 403, "permission_error", None)
        # An unknown path needs the key too, whatever the method: nothing answers it unguarded.
        assert httpx.post(url + "/v1/audio/speech", json={}).status_code == 401


def test_response_ids_are_random_as_vllms(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="none")
    ids = [client.completions.create(model=MODEL, prompt="a", max_tokens=1).id for _ in range(3)]
    ids += [
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a"}], max_tokens=1
        ).id
        for _ in range(3)
    ]
    assert all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids[:3]), ids
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) for i in ids[3:]), ids
    assert len(set(ids)) == len(ids)
