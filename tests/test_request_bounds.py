"""Per-request cost bounds (issue 44): output constraints too large to compile cheaply, too many
stop_token_ids, and scoring that would make a response of millions of log-probabilities are
refused with a 400 naming the field and the flag, before any work; a prompt's scores are
computed once for all its choices; a compile past its timeout is a 400; and a client that leaves
while its grammars wait to compile or its prompts tokenize costs the server no more than the
piece of work already running."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import orjson
import pytest

from baton.app.settings import ServerSettings
from baton.core.config import EngineConfig
from baton.core.request_bounds import RequestBounds
from baton.core.sampling_params import InvalidRequestError
from baton.core.simulation.simulated_executor import SimulatedExecutor
from baton.core.structured_output import GuideKind, StructuredOutput
from baton.core.text.tokenizer import Tokenizer
from baton.gpu.structured_output import XGrammarCompiler
from tests.server_harness import base_url, running_server, simulated_engine

COMPLETIONS = "/v1/completions"


def nested(depth: int) -> dict:
    """An array schema nested `depth` arrays deep (two JSON levels each)."""
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def string_schema(max_length: int) -> dict:
    return {"type": "string", "maxLength": max_length}


def properties(schemas: dict) -> dict:
    return {"type": "object", "properties": schemas}


SCORING = {"echo": True, "logprobs": 5, "n": 16, "max_tokens": 1}
# (what the request sends, the field the 400 names, the flag it names)
TOO_COSTLY = [
    ({"guided_json": nested(70)}, "guided_json", "--max-schema-depth"),
    (
        {"guided_json": properties({f"p{i}": {} for i in range(257)})},
        "guided_json",
        "--max-schema-properties",
    ),
    (
        {"guided_json": {"enum": [f"v{i}" for i in range(1025)]}},
        "guided_json",
        "--max-grammar-choices",
    ),
    ({"guided_json": {"enum": ["x" * 300, "y"]}}, "guided_json", "--max-grammar-literal-chars"),
    ({"guided_json": string_schema(5000)}, "guided_json", "--max-schema-string-lengths"),
    (
        {"guided_json": properties({f"s{i}": string_schema(200) for i in range(6)})},
        "guided_json",
        "--max-schema-string-lengths",
    ),
    (
        {"guided_json": {"type": "string", "pattern": "^[a-z]{0,4000}$"}},
        "guided_json",
        "--max-schema-string-lengths",
    ),
    ({"guided_json": {"const": "z" * 70_000}}, "guided_json", "--max-schema-bytes"),
    ({"guided_regex": "(ab|cd)" * 1200}, "guided_regex", "--max-grammar-bytes"),
    ({"guided_grammar": 'root ::= "' + "a" * 9000 + '"'}, "guided_grammar", "--max-grammar-bytes"),
    ({"guided_choice": [f"c{i}" for i in range(1025)]}, "guided_choice", "--max-grammar-choices"),
    ({"guided_choice": ["w" * 257]}, "guided_choice", "--max-grammar-literal-chars"),
    ({"stop_token_ids": list(range(257))}, "stop_token_ids", "--max-stop-token-ids"),
    ({"prompt": [[5] * 2000] * 8, **SCORING}, "logprobs", "--max-logprobs-entries"),
    (  # no max_tokens: every choice may run to the end of the context
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "logprobs": True,
            "top_logprobs": 20,
            "n": 4,
        },
        "top_logprobs",
        "--max-logprobs-entries",
    ),
    (
        {"prompt": [5] * 1000, "prompt_logprobs": 20, "n": 16},
        "prompt_logprobs",
        "--max-logprobs-entries",
    ),
]


@pytest.fixture(scope="module")
def scored_positions():
    """How many prompt positions the engine's steps scored, all requests together."""
    return []


@pytest.fixture(scope="module")
def server(llama_checkpoint, scored_positions):
    executor = SimulatedExecutor(
        4096, 16, 512, on_batch=lambda batch: scored_positions.append(batch.num_prompt_logprobs)
    )
    engine = simulated_engine(llama_checkpoint, executor, max_num_seqs=32)
    compiler = XGrammarCompiler(llama_checkpoint, 512, [1])
    executor.grammar_compiler = executor.built_grammar_compiler = compiler
    with running_server(engine, model_name="tiny") as state:
        yield state


def post(state, body: dict) -> httpx.Response:
    """A completion of "Hello" (or a chat, where `body` has messages) with `body`'s fields."""
    if "messages" in body:
        path, content = "/v1/chat/completions", orjson.dumps({"model": "tiny", **body})
    else:
        fields = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, **body}
        path, content = COMPLETIONS, orjson.dumps(fields)
    headers = {"content-type": "application/json"}
    return httpx.post(f"{base_url(state)}{path}", content=content, headers=headers, timeout=60)


@pytest.mark.parametrize(("fields", "param", "flag"), TOO_COSTLY)
def test_a_request_past_a_cost_bound_is_refused_naming_field_and_flag(server, fields, param, flag):
    response = post(server, fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert flag in error["message"]


@pytest.mark.parametrize("depth", [128, 300, 600])
def test_a_schema_nested_past_what_json_text_holds_is_a_400_not_a_500(server, depth):
    """orjson writes at most 254 nested levels: deeper schemas were a 500 with a traceback."""
    # Written by hand: orjson cannot write it either.
    schema = '{"type":"array","items":' * depth + '{"type":"integer"}' + "}" * depth
    body = (
        '{"model":"tiny","prompt":"Hello","max_tokens":2,"response_format":{"type":'
        '"json_schema","json_schema":{"name":"deep","schema":' + schema + "}}}"
    )
    response = httpx.post(
        f"{base_url(server)}{COMPLETIONS}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith("response_format")
    assert "levels deep" in error["message"]


def test_requests_within_the_bounds_are_served(server):
    """The bounds leave ordinary constraints and scoring alone."""
    schema = {
        "type": "object",
        "properties": {"name": string_schema(64), "tag": {"enum": ["a", "b", "c"]}},
    }
    for fields in [
        {"guided_json": schema},
        {"guided_choice": ["yes", "no"]},
        {"guided_regex": "[a-z]{1,8}"},
        {"stop_token_ids": list(range(3, 200))},
        {"prompt": [[5] * 100] * 4, "echo": True, "logprobs": 5, "n": 4},
    ]:
        assert post(server, fields).status_code == 200, fields


def test_metrics_show_the_grammar_cache_in_bytes_and_entries(server):
    assert post(server, {"guided_json": {"enum": [f"w{i}" for i in range(500)]}}).status_code == 200
    assert post(server, {"guided_regex": "[0-9]{2,5}"}).status_code == 200
    exposition = httpx.get(f"{base_url(server)}/metrics", timeout=10).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in exposition.splitlines()
        if line.startswith("baton:grammar_cache")
    }
    assert values["baton:grammar_cache_entries"] >= 2
    assert values["baton:grammar_cache_bytes"] > 1000


def test_each_prompt_is_scored_once_for_all_its_choices(server, scored_positions):
    """`echo` + `logprobs` with `n`: the first choice scores the prompt and every choice
    carries the same prompt log-probabilities, streamed or whole."""
    prompts = [[5, 6, 7, 8, 9, 10] * 5, [11, 12, 13] * 7]
    body = {"prompt": prompts, "echo": True, "logprobs": 2, "n": 4, "max_tokens": 3}
    scored_positions.clear()
    whole = post(server, body).json()
    assert sum(scored_positions) == sum(len(p) - 1 for p in prompts)
    choices = whole["choices"]
    assert len(choices) == 8
    for group, prompt in enumerate(prompts):
        group_choices = choices[group * 4 : group * 4 + 4]
        echoed = [c["logprobs"]["token_logprobs"][: len(prompt)] for c in group_choices]
        assert echoed[0][0] is None and all(isinstance(lp, float) for lp in echoed[0][1:])
        assert all(e == echoed[0] for e in echoed)
    scored_positions.clear()
    streamed = stream_choices(server, {**body, "stream": True})
    assert sum(scored_positions) == sum(len(p) - 1 for p in prompts)
    for index, choice in enumerate(choices):
        prompt_part = choice["logprobs"]["token_logprobs"][: len(prompts[index // 4])]
        assert streamed[index][: len(prompt_part)] == prompt_part


def stream_choices(state, body: dict) -> dict[int, list]:
    """Each choice's `token_logprobs`, in the order its chunks came."""
    tops: dict[int, list] = {}
    url = f"{base_url(state)}{COMPLETIONS}"
    with httpx.stream("POST", url, json={"model": "tiny", **body}, timeout=60) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                if choice.get("logprobs"):
                    scores = choice["logprobs"]["token_logprobs"]
                    tops.setdefault(choice["index"], []).extend(scores)
    return tops


def test_bounds_are_checked_on_the_constraint_text():
    bounds = RequestBounds(max_schema_depth=4, max_grammar_bytes=10)
    bounds.check_constraint(StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(nested(3))))
    with pytest.raises(InvalidRequestError, match="nests 5 levels deep"):
        bounds.check_constraint(StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(nested(4))))
    with pytest.raises(InvalidRequestError, match=r"11 characters.*--max-grammar-bytes"):
        bounds.check_constraint(StructuredOutput(GuideKind.REGEX, "a" * 11, "guided_regex"))
    bounds.check_constraint(StructuredOutput(GuideKind.JSON_OBJECT))


# A string bound far past the defaults, so its compile takes a measurable time.
SLOW_LENGTH = 900


def slow_schema(tag: int) -> dict:
    # Distinct schemas: none comes from the compile cache.
    return {"type": "object", "properties": {f"k{tag}": string_schema(SLOW_LENGTH)}}


def slow_request(tag: int) -> dict:
    return {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "guided_json": slow_schema(tag)}


@pytest.fixture
def slow_compile_server(llama_checkpoint):
    """A server whose bounds let a slow grammar through, and the CPU seconds one such compile
    takes here."""
    compiler = XGrammarCompiler(llama_checkpoint, 512, [1])
    compiler.compile(StructuredOutput(GuideKind.JSON_OBJECT))  # xgrammar's one-off set-up
    start = time.process_time()
    compiler.compile(StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(slow_schema(-1))))
    one_compile_s = time.process_time() - start
    executor = SimulatedExecutor(4096, 16, 512)
    engine = simulated_engine(llama_checkpoint, executor, max_num_seqs=8)
    executor.grammar_compiler = compiler
    with running_server(
        engine, model_name="tiny", max_schema_string_lengths=10 * SLOW_LENGTH
    ) as state:
        yield state, one_compile_s


def test_a_compile_past_its_timeout_is_a_400_saying_to_simplify(slow_compile_server):
    state, one_compile_s = slow_compile_server
    state.settings.grammar_compile_timeout_s = one_compile_s / 20
    response = post(state, {"guided_json": slow_schema(0)})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "guided_json"
    assert "took longer than" in error["message"] and "simplify it" in error["message"]


def test_grammars_of_a_client_that_left_never_compile(slow_compile_server, monkeypatch):
    """Six requests whose grammars each take a while to compile, dropped by their clients once
    all six are admitted up to the compile: the one compiling then finishes, the rest never
    start, so the server spends at most about one compile of CPU after they left (CPU time,
    not wall time: it holds on a busy machine)."""
    state, one_compile_s = slow_compile_server
    # Admission tokenizes a short prompt on the event loop, then queues the compile at once.
    tokenized = threading.Semaphore(0)
    encode = Tokenizer.encode

    def counted(self, *args, **kwargs):
        tokenized.release()
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "encode", counted)

    async def leave_early() -> None:
        async with httpx.AsyncClient(base_url=base_url(state), timeout=60) as client:
            requests = [
                asyncio.ensure_future(client.post(COMPLETIONS, json=slow_request(i)))
                for i in range(1, 7)
            ]
            for _ in requests:
                await asyncio.to_thread(tokenized.acquire, timeout=60)
            for request in requests:
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)

    asyncio.run(leave_early())
    left = time.process_time()
    idle_since = time.monotonic()
    last = left
    # Until the process has been idle for a second (or a minute has passed).
    deadline = time.monotonic() + 60
    while time.monotonic() - idle_since < 1.0 and time.monotonic() < deadline:
        time.sleep(0.2)
        now = time.process_time()
        if now - last > 0.05:
            idle_since = time.monotonic()
        last = now
    assert time.process_time() - left < 2.5 * one_compile_s


def test_prompts_of_a_client_that_left_are_not_tokenized(server, monkeypatch):
    """A completion of many prompts, dropped by its client while they tokenize on a worker:
    the prompts not yet started are skipped. (The tokenizer is slowed down, as a long prompt
    of a large vocabulary would be.)"""
    started = threading.Semaphore(0)
    calls: list[float] = []
    encode = Tokenizer.encode

    def slow(self, *args, **kwargs):
        calls.append(time.monotonic())
        started.release()
        time.sleep(0.05)
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "encode", slow)
    # Long enough together to be tokenized off the event loop.
    prompts = [f"{i} " + "the quick brown fox " * 10 for i in range(200)]

    async def leave_early() -> float:
        async with httpx.AsyncClient(base_url=base_url(server), timeout=60) as client:
            body = {"model": "tiny", "prompt": prompts, "max_tokens": 1}
            request = asyncio.ensure_future(client.post(COMPLETIONS, json=body))
            for _ in range(3):
                assert await asyncio.to_thread(started.acquire, timeout=60)
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            return time.monotonic()

    left = asyncio.run(leave_early())
    time.sleep(2.0)  # 40 more prompts' time, had they gone on
    # Those started before the server saw the hang-up finish (a few, on a busy machine).
    assert len([t for t in calls if t > left]) <= 10


def test_a_bound_that_is_not_positive_stops_the_start_up_naming_its_flag():
    with pytest.raises(ValueError, match="--max-schema-depth must be a positive number"):
        ServerSettings(max_schema_depth=0)
    with pytest.raises(ValueError, match="--grammar-compile-timeout must be a positive number"):
        ServerSettings(grammar_compile_timeout_s=-1.0)
    with pytest.raises(ValueError, match="--grammar-cache-memory must be >= 0"):
        EngineConfig(grammar_cache_bytes=-1)
