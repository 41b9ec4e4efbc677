"""vLLM's request extensions and OpenAI's retention fields, each through the official client or
raw HTTP: chat template inputs (`chat_template_kwargs`, `reasoning_effort`,
`add_generation_prompt`, `continue_final_message`), chat `echo`, the text options
(`include_stop_str_in_output`, `skip_special_tokens`, `spaces_between_special_tokens`),
`truncate_prompt_tokens`, `structured_outputs`, and `store` / `metadata`."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import orjson
import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from baton.core.text.tokenizer import Tokenizer
from tests.server_harness import (
    ScriptedExecutor,
    base_url,
    model_engine,
    running_server,
    simulated_engine,
)

MAX_MODEL_LEN = 128
USER = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def scripted(think_checkpoint):
    tokenizer = Tokenizer.from_pretrained(think_checkpoint)
    executor = ScriptedExecutor(tokenizer.vocab_size, tokenizer.eos_token_id)
    engine = simulated_engine(think_checkpoint, executor, max_model_len=MAX_MODEL_LEN)
    with running_server(engine, model_name="tiny") as state:
        yield state, executor


def answer_with(scripted, text: str) -> None:
    state, executor = scripted
    executor.answer = state.tokenizer.encode(text, add_special_tokens=False)


def last_prompt(scripted) -> str:
    """The prompt the engine was last given, as text with its special tokens."""
    state, executor = scripted
    ids = list(executor.prompts.values())[-1]
    return state.tokenizer.decode(ids, skip_special_tokens=False)


def client(state) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)


def chat(state, messages=(USER,), **fields):
    async def run():
        async with client(state) as api:
            return await api.chat.completions.create(
                model="tiny", messages=list(messages), **fields
            )

    return asyncio.run(run())


def streamed_chat_deltas(state, messages=(USER,), **fields) -> list:
    async def run():
        async with client(state) as api:
            stream = await api.chat.completions.create(
                model="tiny", messages=list(messages), stream=True, **fields
            )
            return [chunk.choices[0].delta async for chunk in stream if chunk.choices]

    return asyncio.run(run())


def post(state, path: str, body: dict) -> httpx.Response:
    return httpx.post(base_url(state) + path, json=body, timeout=60)


def streamed_text(response: httpx.Response) -> str:
    chunks = [orjson.loads(line[6:]) for line in response.text.splitlines() if line[6:7] == "{"]
    return "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])


# --- the chat template's inputs ----------------------------------------------------------


def test_reasoning_effort_and_chat_template_kwargs_reach_the_template(scripted):
    state, _ = scripted
    answer_with(scripted, "ok")
    chat(state, reasoning_effort="high")
    assert "<|system|>\nReasoning: high<|end|>" in last_prompt(scripted)
    assert last_prompt(scripted).endswith("<|assistant|>\n")
    # vLLM's: effort "none" switches off templates that think only when enable_thinking.
    chat(state, reasoning_effort="none")
    assert last_prompt(scripted).endswith("<|assistant|>\n<think>\n\n</think>\n\n")
    # chat_template_kwargs win over what reasoning_effort implies.
    thinking_on = {"chat_template_kwargs": {"enable_thinking": True}}
    chat(state, reasoning_effort="none", extra_body=thinking_on)
    assert last_prompt(scripted).endswith("<|assistant|>\n")
    chat(state, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert last_prompt(scripted).endswith("<think>\n\n</think>\n\n")
    assert "Reasoning:" not in last_prompt(scripted)


def test_add_generation_prompt_false_leaves_the_assistant_turn_unopened(scripted):
    state, _ = scripted
    answer_with(scripted, "ok")
    chat(state, extra_body={"add_generation_prompt": False})
    assert last_prompt(scripted).endswith("<|user|>\nhi<|end|>\n")


PREFILL = [USER, {"role": "assistant", "content": "The answer is"}]
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}


def test_continue_final_message_continues_it_and_echo_repeats_it(scripted):
    state, _ = scripted
    answer_with(scripted, " forty-two.")
    whole = chat(state, PREFILL, extra_body={**CONTINUE, "echo": True})
    assert last_prompt(scripted).endswith("<|assistant|>\nThe answer is")
    assert whole.choices[0].message.content == "The answer is forty-two."
    deltas = streamed_chat_deltas(state, PREFILL, extra_body={**CONTINUE, "echo": True})
    assert deltas[0].role == "assistant" and deltas[0].content == "The answer is"
    assert "".join(d.content or "" for d in deltas) == "The answer is forty-two."
    # Without echo the answer is only what the model wrote.
    assert chat(state, PREFILL, extra_body=CONTINUE).choices[0].message.content == " forty-two."


def test_echo_repeats_nothing_when_the_last_message_is_not_the_assistants(scripted):
    state, _ = scripted
    answer_with(scripted, "Hello.")
    assert chat(state, extra_body={"echo": True}).choices[0].message.content == "Hello."


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
    ],
)
def test_chat_fields_out_of_bounds_are_refused_by_name(scripted, fields, param):
    state, _ = scripted
    body = {"messages": PREFILL, "max_tokens": 2, **fields}
    response = post(state, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].split(".")[0] == param


def test_store_and_metadata_are_accepted_and_kept_nowhere(scripted):
    state, _ = scripted
    answer_with(scripted, "Stored?")
    reply = chat(state, store=True, metadata={"project": "baton", "run": "7"})
    assert reply.choices[0].message.content == "Stored?"
    response = httpx.get(f"{base_url(state)}/v1/chat/completions/{reply.id}", timeout=10)
    assert response.status_code in (404, 405)


# --- text options ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_string(scripted, stream):
    state, _ = scripted
    answer_with(scripted, "alpha beta gamma delta")

    def text(**fields) -> str:
        body = {"prompt": "go", "max_tokens": 32, "stream": stream, **fields}
        response = post(state, "/v1/completions", body)
        assert response.status_code == 200, response.text
        return streamed_text(response) if stream else response.json()["choices"][0]["text"]

    assert text(stop=[" gamma"]) == "alpha beta"
    assert text(stop=[" gamma"], include_stop_str_in_output=True) == "alpha beta gamma"
    # A stop token's text too; one that decoding skips (EOS) adds nothing.
    end = state.tokenizer.token_to_id("</think>")
    answer_with(scripted, "one</think>two")
    assert text(stop_token_ids=[end]) == "one"
    assert text(stop_token_ids=[end], include_stop_str_in_output=True) == "one</think>"
    answer_with(scripted, "all")
    assert text(include_stop_str_in_output=True) == "all"


def test_skip_special_tokens_false_shows_them(scripted):
    state, _ = scripted
    answer_with(scripted, "a<|pad|>b")
    body = {"prompt": "go", "max_tokens": 8}
    shown = post(state, "/v1/completions", {**body, "skip_special_tokens": False})
    assert shown.json()["choices"][0]["text"] == "a<|pad|>b"
    assert post(state, "/v1/completions", body).json()["choices"][0]["text"] == "ab"


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """A WordPiece tokenizer, whose decoder puts a space before every word, special or not."""
    vocab = {"[UNK]": 0, "[E]": 1, "hello": 2, "world": 3, "go": 4}
    backend = BackendTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens([AddedToken(t, special=True) for t in ("[E]", "[A]", "[B]")])
    folder = tmp_path_factory.mktemp("wordpiece")
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[E]"}))
    tokenizer = Tokenizer.from_pretrained(folder)
    answer = tokenizer.encode("hello [A][B] world", add_special_tokens=False)
    executor = ScriptedExecutor(tokenizer.vocab_size, tokenizer.eos_token_id, answer)
    with running_server(simulated_engine(folder, executor), model_name="tiny") as state:
        yield state


def test_spaces_between_special_tokens_false_joins_adjacent_ones(wordpiece):
    def text(**fields) -> str:
        body = {"prompt": "go", "max_tokens": 8, "skip_special_tokens": False, **fields}
        return post(wordpiece, "/v1/completions", body).json()["choices"][0]["text"]

    # The decoder's space before the first word stays: the text follows the prompt's "go".
    assert text() == " hello [A] [B] world"
    assert text(spaces_between_special_tokens=False) == " hello [A][B] world"
    assert text(skip_special_tokens=True, spaces_between_special_tokens=False) == " hello world"


# --- truncate_prompt_tokens --------------------------------------------------------------

LONG_PROMPT = " ".join(f"word{i}" for i in range(200))


def test_truncate_prompt_tokens_keeps_the_last_tokens(scripted):
    state, executor = scripted
    answer_with(scripted, "ok")
    ids = state.tokenizer.encode(LONG_PROMPT)
    assert len(ids) > MAX_MODEL_LEN
    body = {"prompt": LONG_PROMPT, "max_tokens": 8, "truncate_prompt_tokens": 5}
    response = post(state, "/v1/completions", {**body, "echo": True})
    assert response.status_code == 200, response.text
    assert list(executor.prompts.values())[-1] == ids[-5:]
    assert response.json()["usage"]["prompt_tokens"] == 5
    # Echo shows the prompt the model was given.
    kept = state.tokenizer.decode(ids[-5:])
    assert response.json()["choices"][0]["text"] == kept + "ok"
    # -1: as many as leave room for max_tokens.
    fitted = post(state, "/v1/completions", {**body, "truncate_prompt_tokens": -1})
    assert fitted.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN - 8
    reply = chat(
        state,
        [{"role": "user", "content": LONG_PROMPT}],
        max_tokens=8,
        extra_body={"truncate_prompt_tokens": 7},
    )
    assert reply.usage.prompt_tokens == 7
    rendered = state.tokenizer.encode_chat([{"role": "user", "content": LONG_PROMPT}])
    assert list(executor.prompts.values())[-1] == rendered[-7:]


@pytest.mark.parametrize("count", [0, -2, MAX_MODEL_LEN + 1])
def test_truncate_prompt_tokens_out_of_range_is_refused(scripted, count):
    state, _ = scripted
    body = {"prompt": "go", "max_tokens": 2, "truncate_prompt_tokens": count}
    response = post(state, "/v1/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "truncate_prompt_tokens"


# --- structured_outputs, on a random model -----------------------------------------------

WORD = {"type": "string", "pattern": "^[a-z]{1,6}$"}
SCHEMA = {"type": "object", "properties": {"name": WORD}, "required": ["name"]}


@pytest.fixture(scope="module")
def model_server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=256, max_num_seqs=16)
    with running_server(engine, model_name="tiny") as state:
        yield state


@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"choice": ["red", "green"]}, lambda text: text in ("red", "green")),
        ({"regex": "[ab]{2,4}"}, lambda text: re.fullmatch("[ab]{2,4}", text)),
        ({"json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
        ({"json": json.dumps(SCHEMA)}, lambda text: "name" in json.loads(text)),
        ({"json_object": True}, lambda text: isinstance(json.loads(text), dict)),
        ({"grammar": 'root ::= "x" | "yy"'}, lambda text: text in ("x", "yy")),
    ],
)
def test_structured_outputs_constrain_completions_and_chat(model_server, constraint, check):
    options = {"disable_any_whitespace": True, "disable_fallback": True}
    fields = {"structured_outputs": {**constraint, **options}, "temperature": 1.0}
    completion = post(
        model_server, "/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 48, **fields}
    )
    assert completion.status_code == 200, completion.text
    finished = [c["text"] for c in completion.json()["choices"] if c["finish_reason"] == "stop"]
    assert finished and all(check(text) for text in finished), finished
    reply = chat(model_server, max_tokens=48, extra_body=fields)
    if reply.choices[0].finish_reason == "stop":
        assert check(reply.choices[0].message.content)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "structured_outputs.regex"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
        ({"structured_outputs": {"json": "[1"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "(", "nope": 1}}, "structured_outputs"),
    ],
)
def test_structured_outputs_that_ask_for_none_or_several_are_refused(model_server, fields, param):
    response = post(model_server, "/v1/completions", {"prompt": "a", "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith(param)
