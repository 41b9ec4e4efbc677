"""Structured output (xgrammar): sampled outputs of a random-weight model at temperature 1 obey
their JSON schema, regex, choices or grammar, streamed and whole, over HTTP and WebSocket;
unconstrained neighbours in the batch are unchanged; a constraint that cannot compile is a 400
naming its field; matchers stay level with the tokens through preemption and re-run steps."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import orjson
import pydantic
import pytest
import torch
import xgrammar
from websockets.asyncio.client import connect

from baton.app.llm import LLM
from baton.core.batch import ScheduledSequence
from baton.core.sampling_params import SamplingParams
from baton.core.structured_output import GuideKind, StructuredOutput
from baton.core.text.tokenizer import Tokenizer
from baton.gpu.structured_output import GrammarMask, GrammarMatchers, XGrammarCompiler
from tests.server_harness import base_url, model_engine, running_server

# Strings are bounded by patterns: a random model closes an unbounded string only by chance.
WORD = {"type": "string", "pattern": "^[a-z]{1,6}$"}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": WORD,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "address": {
                "type": "object",
                "properties": {
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    "city": WORD,
                },
                "required": ["zip"],
            },
        },
        "required": ["name", "address"],
    },
    "arrays_and_enums": {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 4,
            },
            "size": {"type": "string", "enum": ["S", "M", "L"]},
            "ok": {"type": "boolean"},
        },
        "required": ["colors", "size", "ok"],
    },
    # Length bounds: xgrammar alone lets control characters into these (a strict parser's
    # error); Baton compiles them as patterns.
    "bounded_strings": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 2, "maxLength": 5},
            "words": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        },
        "required": ["code", "words"],
    },
    "bounded_numbers": {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "note": WORD,
        },
        "required": ["count", "ratio"],
    },
}
NUM_SAMPLES = 20
EOS = 1  # the test tokenizer's <|end|>
SAMPLED = {"temperature": 1.0, "max_tokens": 96}


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=1024, max_num_seqs=64)
    with running_server(engine, model_name="tiny") as state:
        yield state


def post(state, path: str, body: dict) -> httpx.Response:
    return httpx.post(base_url(state) + path, json=body, timeout=120)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def streamed_texts(response: httpx.Response, num_choices: int) -> tuple[list[str], list[str]]:
    texts, reasons = [""] * num_choices, [""] * num_choices
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in orjson.loads(line[6:])["choices"]:
            texts[choice["index"]] += choice["text"]
            reasons[choice["index"]] = choice["finish_reason"] or reasons[choice["index"]]
    return texts, reasons


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_sampled_outputs_parse_and_validate_streamed_and_whole(server, name):
    schema = SCHEMAS[name]
    body = {
        "prompt": [f"sample {i}" for i in range(NUM_SAMPLES)],
        "response_format": schema_format(schema),
        **SAMPLED,
    }

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=120) as client:
            return await asyncio.gather(
                client.post("/v1/completions", json=body),
                client.post("/v1/completions", json={**body, "stream": True}),
            )

    whole, streamed = asyncio.run(both())
    assert whole.status_code == 200 and streamed.status_code == 200, whole.text
    choices = whole.json()["choices"]
    texts, reasons = streamed_texts(streamed, NUM_SAMPLES)
    texts += [choice["text"] for choice in choices]
    reasons += [choice["finish_reason"] for choice in choices]
    assert reasons == ["stop"] * (2 * NUM_SAMPLES)
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts)) > 1  # sampled, not one answer repeated


def test_chat_json_schema_through_the_openai_client(server):
    schema = SCHEMAS["arrays_and_enums"]

    async def ask() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{base_url(server)}/v1", api_key="x")
        responses = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"colors {i}"}],
                    response_format=schema_format(schema),
                    **SAMPLED,
                )
                for i in range(4)
            ]
        )
        return [r.choices[0].message.content for r in responses]

    for text in asyncio.run(ask()):
        jsonschema.validate(json.loads(text), schema)


def test_guided_choice_only_ever_yields_a_choice(server):
    choices = ["yes", "no", "maybe so", "{not json}"]
    body = {"prompt": ["pick"] * NUM_SAMPLES, "guided_choice": choices, **SAMPLED}
    texts = [choice["text"] for choice in post(server, "/v1/completions", body).json()["choices"]]
    assert set(texts) <= set(choices)
    assert len(set(texts)) > 1


def test_guided_regex_and_grammar_are_followed(server):
    regex = r"[a-z]{3}-[0-9]{2}"
    body = {"prompt": ["code"] * 8, "guided_regex": regex, **SAMPLED}
    for choice in post(server, "/v1/completions", body).json()["choices"]:
        assert re.fullmatch(regex, choice["text"]), choice["text"]
    grammar = 'root ::= "yes" | "no" | "maybe " [0-9]'
    body = {"prompt": ["answer"] * 8, "guided_grammar": grammar, **SAMPLED}
    for choice in post(server, "/v1/completions", body).json()["choices"]:
        assert re.fullmatch(r"yes|no|maybe [0-9]", choice["text"]), choice["text"]


def test_json_object_outputs_that_finish_are_objects(server):
    # Seeded, so the same 16 samples at any batch composition: a free-form object from a
    # random model may run past max_tokens, and 4 unseeded samples once all did.
    body = {
        "messages": [{"role": "user", "content": "json please"}],
        "response_format": {"type": "json_object"},
        "n": 16,
        "seed": 7,
        **SAMPLED,
    }
    finished = 0
    for choice in post(server, "/v1/chat/completions", body).json()["choices"]:
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["message"]["content"]), dict)
            finished += 1
    assert finished > 0


def test_unconstrained_requests_batched_with_constrained_ones_are_unchanged(server):
    free = {"prompt": "The for statement", "temperature": 0.0, "max_tokens": 24}
    alone = post(server, "/v1/completions", free).json()["choices"][0]["text"]
    constrained = {
        "prompt": [f"x {i}" for i in range(8)],
        "response_format": schema_format(SCHEMAS["nested"]),
        **SAMPLED,
    }

    async def mixed() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=120) as client:
            return await asyncio.gather(
                client.post("/v1/completions", json=constrained),
                *[client.post("/v1/completions", json=free) for _ in range(4)],
            )

    _, *frees = asyncio.run(mixed())
    assert [r.json()["choices"][0]["text"] for r in frees] == [alone] * 4


def test_websocket_generate_frames_take_the_same_fields(server):
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ws"

    async def scenario() -> tuple[str, dict]:
        async with connect(url) as socket:
            frame = {
                "type": "generate",
                "id": 1,
                "prompt": "pick",
                "guided_choice": ["alpha", "beta"],
                **SAMPLED,
            }
            await socket.send(orjson.dumps(frame).decode())
            text = ""
            while True:
                answer = orjson.loads(await socket.recv())
                if answer["type"] == "token":
                    text += answer["text"]
                else:
                    return text, answer

    text, done = asyncio.run(scenario())
    assert done["type"] == "done" and done["finish_reason"] == "stop"
    assert text in ("alpha", "beta")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"response_format": schema_format({"type": "object", "properties": {"a": 5}})},
            "response_format",
            "cannot be compiled",
        ),
        ({"guided_regex": "(unclosed"}, "guided_regex", "cannot be compiled"),
        ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar", "cannot be compiled"),
        ({"guided_json": "{not json"}, "guided_json", "not a JSON schema"),
        (
            {"guided_regex": "a", "guided_choice": ["a"]},
            "guided_choice",
            "each constrain the output",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format", "type"),
        ({"guided_choice": []}, "guided_choice", ""),
        ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos", "cannot be combined"),
    ],
)
def test_a_constraint_that_cannot_be_served_is_a_400_naming_its_field(server, fields, param, words):
    body = {"prompt": "x", "max_tokens": 4, **fields}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].split(".")[0] == param
    assert words in error["message"]


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        (GuideKind.JSON_OBJECT, ""),
        (GuideKind.JSON_SCHEMA, json.dumps(SCHEMAS["arrays_and_enums"])),
    ],
)
def test_json_is_compact_with_no_whitespace_between_its_tokens(llama_checkpoint, kind, spec):
    """As the README promises: the grammar takes `json.dumps(..., separators=(",", ":"))`'s
    text and refuses a space after a comma or colon, or anywhere else outside a string."""
    compiled = XGrammarCompiler(llama_checkpoint, 512, [1]).compile(StructuredOutput(kind, spec))
    value = {"colors": ["red", "blue"], "size": "M", "ok": True}

    def accepts(text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(compiled.grammar)
        return matcher.accept_string(text) and matcher.is_completed()

    assert accepts(json.dumps(value, separators=(",", ":")))
    assert not accepts(json.dumps(value))  # ", " and ": "
    assert not accepts(json.dumps(value, indent=1))
    assert not accepts(" " + json.dumps(value, separators=(",", ":")))


def enum_schema(num_values: int, tag: str) -> StructuredOutput:
    values = [f"{tag}{i:05d}" for i in range(num_values)]
    return StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps({"enum": values}))


def test_compile_cache_is_bounded_in_bytes_and_reused(llama_checkpoint):
    """The cache holds what xgrammar says compiled grammars take, up to its byte limit: a big
    enum evicts the oldest entries by their size, not their count."""
    probe = XGrammarCompiler(llama_checkpoint, 512, [1])
    regexes = ["a+", "b+", "c+", "d+"]
    size = {
        regex: probe.compile(StructuredOutput(GuideKind.REGEX, regex)).grammar.memory_size_bytes
        for regex in regexes
    }
    big = probe.compile(enum_schema(2000, "x")).grammar.memory_size_bytes
    assert big > 4 * max(size.values())
    limit = big + size["c+"] + size["d+"]
    compiler = XGrammarCompiler(llama_checkpoint, 512, [1], cache_bytes=limit)
    first = compiler.compile(StructuredOutput(GuideKind.REGEX, "a+"))
    again = compiler.compile(StructuredOutput(GuideKind.REGEX, "a+"))
    assert again.grammar is first.grammar
    for regex in regexes[1:]:
        compiler.compile(StructuredOutput(GuideKind.REGEX, regex))
    assert compiler.num_cached == 4
    assert compiler.cached_bytes == sum(size.values())
    compiler.compile(enum_schema(2000, "x"))  # evicts the two oldest, whatever their count
    assert compiler.num_cached == 3
    assert compiler.cached_bytes == limit
    refused = XGrammarCompiler(llama_checkpoint, 512, [1], cache_bytes=big - 1)
    refused.compile(enum_schema(2000, "y"))  # larger than the whole cache: served, not kept
    assert refused.num_cached == 0 and refused.cached_bytes == 0


def test_matcher_catches_up_and_rolls_back_to_the_tokens_it_is_given(llama_checkpoint):
    """A matcher is levelled with the sequence's outputs before each mask: tokens it missed
    are accepted, tokens of a step that is run again are rolled back, never accepted twice."""
    compiler = XGrammarCompiler(llama_checkpoint, 512, [1])
    params = SamplingParams(
        structured_output=compiler.compile(StructuredOutput(GuideKind.REGEX, "ab"))
    )
    tokenizer = Tokenizer.from_pretrained(llama_checkpoint)
    a, b = tokenizer.encode("a", False), tokenizer.encode("b", False)
    prompt = [5, 6]

    def sequence(outputs: list[int]) -> ScheduledSequence:
        all_ids = prompt + outputs
        return ScheduledSequence("r", all_ids[-1:], len(all_ids) - 1, [0], True, params, all_ids, 2)

    matchers = GrammarMatchers(512)
    first = allowed(matchers.fill_mask([sequence([])]))
    assert set(a) <= first and not set(b) & first
    matchers.accept([sequence([])], a)
    # The same step again (a re-run after a fault): the accepted "a" is undone first.
    assert allowed(matchers.fill_mask([sequence([])])) == first
    # Two tokens ahead of what it accepted (outputs it never saw): it catches up.
    assert allowed(matchers.fill_mask([sequence(a + b)])) == {EOS}
    matchers.release(["r"])
    assert len(matchers) == 0


def allowed(mask: GrammarMask | None) -> set[int]:
    assert mask is not None
    logits = mask.apply(torch.zeros(1, 512))[0]
    return set((logits > float("-inf")).nonzero().flatten().tolist())


def test_preempted_constrained_requests_still_match_their_grammar(llama_checkpoint):
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=24, max_num_seqs=8)
    constraint = StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(SCHEMAS["nested"]))
    params = SamplingParams(temperature=1.0, max_tokens=80, structured_output=constraint)
    results = llm.generate([f"prompt number {i} " * 3 for i in range(8)], params)
    assert llm.engine.scheduler.num_preemptions > 0
    for result in results:
        jsonschema.validate(json.loads(result.text), SCHEMAS["nested"])


def test_a_model_vocabulary_padded_past_the_tokenizer_never_yields_padding(make_checkpoint):
    """The bitmask spans the model's 640 logits; the 128 ids past the tokenizer's 512 have no
    text and no grammar allows them."""
    llm = LLM(make_checkpoint("llama", vocab_size=640), device="cpu", max_num_seqs=8)
    constraint = StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(SCHEMAS["arrays_and_enums"]))
    params = SamplingParams(temperature=1.0, max_tokens=80, structured_output=constraint)
    for result in llm.generate([f"padded {i}" for i in range(8)], params):
        assert max(result.token_ids) < 512
        jsonschema.validate(json.loads(result.text), SCHEMAS["arrays_and_enums"])


class Forecast(pydantic.BaseModel):
    # Closed choices, so a random model's answer is short whatever it picks.
    city: Literal["Oslo", "Lima"]
    sky: Literal["clear", "rain"]
    windy: bool


def test_the_sdks_parse_returns_the_model_it_asked_for(llama_checkpoint):
    # `client.chat.completions.parse` sends a strict json_schema made from a pydantic model and
    # validates the answer back into it: the random model is held to the schema by the grammar.
    engine = model_engine(llama_checkpoint, num_kv_blocks=256, max_num_seqs=4)
    with running_server(engine, model_name="tiny") as state:
        api = openai.OpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)
        completion = api.chat.completions.parse(
            model="tiny",
            messages=[{"role": "user", "content": "The weather?"}],
            response_format=Forecast,
            max_tokens=200,
            temperature=0,
        )

    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Forecast)
    assert Forecast.model_validate_json(message.content) == message.parsed
