"""Tool calling with `auto`: each format's parser on fixed model outputs, streamed deltas that
reassemble into the whole answer's calls, and the official openai client reading tool_calls
whole and streamed (forced calls: tests/test_forced_tool_calls.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from websockets.asyncio.client import connect

from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.guided import ToolMode
from baton.app.api.protocol import validate_request
from baton.app.api.tools.tool_calls import ToolCallStream
from baton.app.api.tools.tool_parsers import (
    HermesParser,
    Llama3JSONParser,
    MistralParser,
    parser_for,
)
from tests.server_harness import base_url, model_engine, running_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, CLOCK]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLED = {"temperature": 1.0, "max_tokens": 96}

HERMES_OUTPUT = (
    "Let me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
)
LLAMA3_OUTPUT = (
    '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
    '{"name": "get_time", "parameters": {"zone": "CET"}}'
)
MISTRAL_OUTPUT = (
    '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
    '{"name": "get_time", "arguments": {"zone": "CET"}}]'
)
EXPECTED_CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("get_time", {"zone": "CET"}),
]


@pytest.mark.parametrize(
    ("parser", "text", "content"),
    [
        (HermesParser(), HERMES_OUTPUT, "Let me look."),
        (Llama3JSONParser(), LLAMA3_OUTPUT, ""),
        (Llama3JSONParser(), "<|python_tag|>" + LLAMA3_OUTPUT, ""),
        (MistralParser(), MISTRAL_OUTPUT, ""),
    ],
)
def test_each_format_parses_its_calls_and_content(parser, text, content):
    parsed = parser.parse(text)
    assert parsed.content == content
    calls = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    assert calls == EXPECTED_CALLS
    assert len({c.id for c in parsed.tool_calls}) == 2


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (HermesParser(), "No tools needed: the answer is 4."),
        (HermesParser(), '<tool_call>\n{"name": "get_weather", "argu'),  # cut off
        (Llama3JSONParser(), "It is sunny {today}."),
        (Llama3JSONParser(), '{"city": "Paris"}'),  # JSON, but no call
        (MistralParser(), "[TOOL_CALLS] not json"),
    ],
)
def test_text_that_is_no_call_stays_content(parser, text):
    parsed = parser.parse(text)
    assert parsed.tool_calls == [] and parsed.content == text


def test_the_parser_comes_from_the_flag_or_the_chat_template():
    assert parser_for(None, {"default": "{{ '<tool_call>' }}"}).name == "hermes"
    assert parser_for(None, {"default": "[TOOL_CALLS]"}).name == "mistral"
    assert parser_for(None, {"default": "<|python_tag|>"}).name == "llama3_json"
    assert parser_for(None, {"default": "plain"}) is None
    assert parser_for("mistral", {"default": "<tool_call>"}).name == "mistral"


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (HermesParser(), HERMES_OUTPUT),
        (Llama3JSONParser(), "  " + LLAMA3_OUTPUT),
        (MistralParser(), MISTRAL_OUTPUT),
        (HermesParser(), "a <tool but no call, and <tool_call"),
    ],
)
@pytest.mark.parametrize("piece_size", [1, 3, 7, 1000])
def test_streamed_deltas_reassemble_into_the_whole_answer(parser, text, piece_size):
    whole = ToolCallStream(ToolMode.AUTO, parser, None)
    whole.feed(text)
    whole.finish()
    expected = whole.message_fields()
    stream = ToolCallStream(ToolMode.AUTO, parser, None)
    deltas = [stream.feed(text[i : i + piece_size]) for i in range(0, len(text), piece_size)]
    deltas.append(stream.finish())
    content = "".join(piece for piece, _ in deltas)
    calls = reassemble([entry for _, entries in deltas for entry in entries])
    assert content.strip() == (expected["content"] or "").strip()
    # Ids are fresh per answer; each streamed call has one.
    assert all(call_id.startswith("call_") for call_id, _, _ in calls)
    assert [call[1:] for call in calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in expected.get("tool_calls", [])
    ]


def regex_literal(text: str) -> str:
    escapes = {"\n": "\\n"}
    return "".join(c if c.isalnum() or c == " " else escapes.get(c, "\\" + c) for c in text)


def reassemble(entries: list[dict]) -> list[tuple[str, str, str]]:
    """OpenAI's tool_call deltas → (id, name, arguments) per index, as a client joins them."""
    calls: dict[int, list[str]] = {}
    for entry in entries:
        call = calls.setdefault(entry["index"], ["", "", ""])
        call[0] = entry.get("id", call[0])
        call[1] += entry.get("function", {}).get("name", "")
        call[2] += entry.get("function", {}).get("arguments", "")
    return [tuple(calls[i]) for i in sorted(calls)]


def test_assistant_tool_calls_reach_the_template_with_object_arguments():
    body = {
        "messages": [
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": TOOLS,
    }
    request = validate_request(ChatCompletionRequest, body)
    assistant = request.message_dicts()[1]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    names = [tool["function"]["name"] for tool in request.tool_dicts()]
    assert names == ["get_weather", "get_time"]


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=512, max_num_seqs=32)
    with running_server(engine, model_name="tiny", tool_call_parser="hermes") as state:
        yield state


def client(state) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)


def test_auto_parses_the_models_calls_whole_and_streamed(server):
    """The random model is steered into writing a Hermes call with a regex, so `auto`'s
    parsing runs end to end: the answer carries tool_calls, not the raw text."""
    written = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    steer = {"guided_regex": regex_literal("Checking.\n" + written)}

    async def ask():
        api = client(server)
        whole = await api.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, extra_body=steer, **SAMPLED
        )
        content, entries, reason = "", [], None
        async for chunk in await api.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, extra_body=steer, stream=True, **SAMPLED
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                content += delta.content or ""
                entries += [c.model_dump(exclude_none=True) for c in delta.tool_calls or []]
                reason = chunk.choices[0].finish_reason or reason
        return whole, content, entries, reason

    whole, content, entries, reason = asyncio.run(ask())
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {"zone": "UTC"}
    ((_, name, arguments),) = reassemble(entries)
    assert content.strip() == "Checking." and reason == "tool_calls"
    assert (name, json.loads(arguments)) == ("get_time", {"zone": "UTC"})


def test_a_websocket_done_frame_carries_the_calls(server):
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ws"
    frame = {
        "type": "generate",
        "id": "t",
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        **SAMPLED,
    }

    async def scenario() -> dict:
        async with connect(url) as socket:
            await socket.send(json.dumps(frame))
            while (answer := json.loads(await socket.recv()))["type"] == "token":
                pass
            return answer

    done = asyncio.run(scenario())
    assert done["type"] == "done" and done["finish_reason"] == "tool_calls"
    (call,) = done["tool_calls"]
    function = call["function"]
    jsonschema.validate(json.loads(function["arguments"]), SCHEMAS[function["name"]])


def test_tool_requests_the_server_cannot_serve_are_400s(server, llama_checkpoint):
    url = base_url(server) + "/v1/chat/completions"
    unknown = {"type": "function", "function": {"name": "nope"}}
    for fields, param in [
        ({"tools": TOOLS, "tool_choice": unknown}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ]:
        response = httpx.post(url, json={"messages": MESSAGES, "max_tokens": 4, **fields})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"].split("[")[0].split(".")[0] == param


def test_auto_without_a_known_format_is_a_400_that_names_the_flag(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=64, max_num_seqs=4)
    with running_server(engine, model_name="tiny") as state:
        body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 4}
        response = httpx.post(base_url(state) + "/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert "--tool-call-parser" in response.json()["error"]["message"]
        none = {**body, "tool_choice": "none"}
        assert httpx.post(base_url(state) + "/v1/chat/completions", json=none).status_code == 200
