"""Forced tool calls (tool_choice "required" or a named function): the reader that streams a
call's arguments as they are generated, and through the official openai client on a random
model, whose grammar alone makes it write valid, bounded calls that end the turn."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest

from baton.app.api.guided import MAX_PARALLEL_CALLS, ToolMode
from baton.app.api.tools.forced_calls import ForcedCalls
from baton.app.api.tools.tool_calls import ToolCallStream
from tests.server_harness import base_url, model_engine, running_server
from tests.test_tool_calls import MESSAGES, SCHEMAS, TOOLS, client, reassemble

REQUIRED_OUTPUT = (
    '[{"name":"get_weather","parameters":{"city":"Pa\\"ris}","days":[1,{"a":2}]}},'
    '{"name":"get_time","parameters":{"zone":"UTC"}}]'
)
# Enough for the most calls a required answer may make under these tools' schemas.
ROOMY = {"temperature": 1.0, "max_tokens": 960}


def fed_in_pieces(stream: ToolCallStream, text: str, size: int) -> list[dict]:
    deltas = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
    deltas.append(stream.finish())
    assert all(content == "" for content, _ in deltas)
    return [entry for _, entries in deltas for entry in entries]


@pytest.mark.parametrize("piece_size", [1, 3, 7, 1000])
def test_required_calls_stream_their_arguments_as_they_come(piece_size):
    stream = ToolCallStream(ToolMode.REQUIRED, None, None)
    entries = fed_in_pieces(stream, REQUIRED_OUTPUT, piece_size)
    calls = reassemble(entries)
    assert [call[1:] for call in calls] == [
        ("get_weather", '{"city":"Pa\\"ris}","days":[1,{"a":2}]}'),
        ("get_time", '{"zone":"UTC"}'),
    ]
    # Only a call's first delta has its id and name; the rest carry argument text.
    assert sum("id" in entry for entry in entries) == 2
    if piece_size < 7:
        assert sum(entry["index"] == 0 for entry in entries) > 2
    assert stream.finish_reason("stop") == "tool_calls"
    message = stream.message_fields()
    assert message["content"] is None
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [c[2] for c in calls]


def test_a_call_is_announced_as_soon_as_its_name_is_whole():
    reader = ForcedCalls(None)
    assert reader.feed(' [{"name":"get_') == []  # a leading space a first token may carry
    (opening,) = reader.feed('time","parameters":')
    assert opening["function"] == {"name": "get_time", "arguments": ""}
    assert reader.feed('{"zo') == [{"index": 0, "function": {"arguments": '{"zo'}}]
    assert not reader.complete


def test_a_named_call_streams_its_arguments_and_ends_with_tool_calls():
    stream = ToolCallStream(ToolMode.NAMED, None, "get_time")
    entries = [entry for piece in ['{"zo', 'ne":', '"UTC"}'] for entry in stream.feed(piece)[1]]
    entries += stream.finish()[1]
    assert entries[0]["function"]["name"] == "get_time" and "id" in entries[0]
    assert all("id" not in entry for entry in entries[1:]) and len(entries) == 3
    ((_, name, arguments),) = reassemble(entries)
    assert (name, json.loads(arguments)) == ("get_time", {"zone": "UTC"})
    assert stream.finish_reason("stop") == "tool_calls"


def test_a_cut_forced_output_keeps_its_reason_and_gives_no_content():
    cut = ToolCallStream(ToolMode.REQUIRED, None, None)
    fed_in_pieces(cut, REQUIRED_OUTPUT[:60], 5)
    assert cut.finish_reason("length") == "length"
    assert cut.finish_reason("stop") == "stop"  # a stop string cut the array
    (call,) = cut.message_fields()["tool_calls"]
    assert REQUIRED_OUTPUT[:60].endswith(call["function"]["arguments"])
    unnamed = ToolCallStream(ToolMode.REQUIRED, None, None)
    fed_in_pieces(unnamed, '[{"na', 2)
    assert unnamed.message_fields() == {"content": None}


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=512, max_num_seqs=32)
    with running_server(engine, model_name="tiny") as state:
        yield state


def ask_all(server, num: int, **fields) -> list:
    async def ask():
        api = client(server)
        return await asyncio.gather(
            *[
                api.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, **fields)
                for _ in range(num)
            ]
        )

    return asyncio.run(ask())


def assert_valid_calls(choice) -> None:
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_are_bounded_valid_and_end_the_turn(server):
    for response in ask_all(server, 4, tool_choice="required", **ROOMY):
        choice = response.choices[0]
        assert 1 <= len(choice.message.tool_calls) <= MAX_PARALLEL_CALLS
        assert_valid_calls(choice)


def test_required_calls_without_parallel_calls_are_exactly_one(server):
    fields = {"tool_choice": "required", "parallel_tool_calls": False, **ROOMY}
    for response in ask_all(server, 4, **fields):
        assert len(response.choices[0].message.tool_calls) == 1
        assert_valid_calls(response.choices[0])


def test_a_named_choice_calls_exactly_that_function(server):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for response in ask_all(server, 4, tool_choice=choice, **ROOMY):
        (call,) = response.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        assert_valid_calls(response.choices[0])


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_streamed_arguments_come_over_several_deltas_and_match_the_whole(server, tool_choice):
    # Greedy, so the streamed answer and the whole one are the same tokens.
    fields = {"tool_choice": tool_choice, "temperature": 0.0, "max_tokens": 960}

    async def ask():
        api = client(server)
        whole = await api.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, **fields
        )
        entries, reasons = [], []
        async for chunk in await api.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, stream=True, **fields
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                assert not delta.content
                entries += [c.model_dump(exclude_none=True) for c in delta.tool_calls or []]
                reasons.append(chunk.choices[0].finish_reason)
        return whole, entries, reasons

    whole, entries, reasons = asyncio.run(ask())
    assert_valid_calls(whole.choices[0])
    streamed = reassemble(entries)
    assert [c[1:] for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls
    ]
    assert sum(entry["index"] == 0 for entry in entries) > 2
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}


def test_a_forced_call_cut_by_max_tokens_is_length_without_content(server):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for tool_choice in ["required", choice]:
        (response,) = ask_all(server, 1, tool_choice=tool_choice, max_tokens=3)
        answer = response.choices[0]
        assert answer.finish_reason == "length" and not answer.message.content
        for call in answer.message.tool_calls or []:
            with pytest.raises(json.JSONDecodeError):
                json.loads(call.function.arguments)


def test_langchain_bind_tools_any_gets_tool_calls(server):
    """The body LangChain's `ChatOpenAI.bind_tools(tools, tool_choice="any")` sends: tools in
    OpenAI's shape, tool_choice "required", no max_tokens."""
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "stream": False,
        "n": 1,
        "temperature": 0.7,
        "tools": TOOLS,
        "tool_choice": "required",
    }
    for _ in range(2):
        response = httpx.post(base_url(server) + "/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        message = choice["message"]
        assert message["content"] is None and message["tool_calls"]
        for call in message["tool_calls"]:
            function = call["function"]
            jsonschema.validate(json.loads(function["arguments"]), SCHEMAS[function["name"]])
