"""`POST /v1/responses` through the official openai client's `client.responses.create`: text and
message input rendered as the chat prompt, whole and streamed answers whose typed events add
up to the final response, the max_output_tokens cut, function calls parsed and forced, JSON
under a schema from a random-weight model, and the fields Baton refuses."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from baton.core.text.tokenizer import Tokenizer
from tests.server_harness import (
    ScriptedExecutor,
    base_url,
    model_engine,
    running_server,
    simulated_engine,
)

ANSWER = "The sky is blue because air scatters short waves."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}
HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def scripted(llama_checkpoint):
    """A server whose every answer is `executor.answer`, with the Hermes tool-call format."""
    tokenizer = Tokenizer.from_pretrained(llama_checkpoint)
    executor = ScriptedExecutor(tokenizer.vocab_size, tokenizer.eos_token_id)
    engine = simulated_engine(llama_checkpoint, executor)
    with running_server(engine, model_name="tiny", tool_call_parser="hermes") as state:
        yield state, executor


def client(state) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)


def answer_with(scripted, text: str) -> list[int]:
    state, executor = scripted
    executor.answer = state.tokenizer.encode(text, add_special_tokens=False)
    return executor.answer


def collapsed(types: list[str]) -> list[str]:
    """Event types with runs of the same delta type written once."""
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1] or "delta" not in t]


def test_text_input_answers_with_one_completed_message(scripted):
    state, executor = scripted
    answer = answer_with(scripted, ANSWER)
    response = client(state).responses.create(model="tiny", input="Why is the sky blue?")
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.incomplete_details is None
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed"
    assert response.output_text == ANSWER
    prompt = state.tokenizer.encode_chat([{"role": "user", "content": "Why is the sky blue?"}])
    assert executor.prompts[response.id] == prompt
    assert response.usage.input_tokens == len(prompt)
    # The answer's tokens and the end-of-sequence token that closed it.
    assert response.usage.output_tokens == len(answer) + 1
    assert response.usage.total_tokens == len(prompt) + len(answer) + 1


def test_streamed_events_come_in_order_and_add_up_to_the_response(scripted):
    state, _ = scripted
    answer_with(scripted, ANSWER)
    stream = client(state).responses.create(model="tiny", input="Why?", stream=True)
    events = list(stream)
    types = [event.type for event in events]
    assert collapsed(types) == [*TEXT_EVENTS, "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == ANSWER
    final = events[-1].response
    assert final.status == "completed" and final.output_text == ANSWER
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_ids = {event.item_id for event in events if hasattr(event, "item_id")}
    assert item_ids == {final.output[0].id}


def test_instructions_and_message_items_become_the_chat_prompt(scripted):
    state, executor = scripted
    answer_with(scripted, ANSWER)
    response = client(state).responses.create(
        model="tiny",
        instructions="Answer in one line.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {"role": "assistant", "content": "Hi."},
            {"type": "message", "role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
        temperature=0.5,
        top_p=0.9,
        store=True,
        metadata={"run": "7"},
    )
    expected = [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
    assert executor.prompts[response.id] == state.tokenizer.encode_chat(expected)
    assert response.instructions == "Answer in one line."
    assert (response.temperature, response.top_p) == (0.5, 0.9)
    assert response.metadata == {"run": "7"} and response.output_text == ANSWER


def test_max_output_tokens_cuts_the_response_as_incomplete(scripted):
    state, _ = scripted
    answer = answer_with(scripted, ANSWER)
    api = client(state)
    response = api.responses.create(model="tiny", input="Why?", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.output_text == state.tokenizer.decode(answer[:3])
    assert response.usage.output_tokens == 3
    events = list(
        api.responses.create(model="tiny", input="Why?", max_output_tokens=3, stream=True)
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_parsed_tool_call_is_a_function_call_item_whole_and_streamed(scripted):
    state, _ = scripted
    answer_with(scripted, HERMES_CALL)
    api = client(state)
    response = api.responses.create(model="tiny", input="Weather in Paris?", tools=[WEATHER])
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert response.tools[0].name == "get_weather" and response.tool_choice == "auto"
    events = list(
        api.responses.create(model="tiny", input="Weather?", tools=[WEATHER], stream=True)
    )
    assert collapsed([event.type for event in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris", "unit": "celsius"}


def test_a_function_call_and_its_output_go_back_as_chat_turns(scripted):
    state, executor = scripted
    answer_with(scripted, ANSWER)
    arguments = '{"city": "Paris", "unit": "celsius"}'
    response = client(state).responses.create(
        model="tiny",
        tools=[WEATHER],
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": arguments,
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
        ],
    )
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    call["function"]["arguments"] = {"city": "Paris", "unit": "celsius"}
    tool = {k: v for k, v in WEATHER.items() if k != "type"}
    expected = state.tokenizer.encode_chat(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ],
        tools=[{"type": "function", "function": tool}],
    )
    assert executor.prompts[response.id] == expected
    assert response.output_text == ANSWER


def test_previous_response_id_is_refused_because_nothing_is_stored(scripted):
    state, _ = scripted
    with pytest.raises(openai.BadRequestError) as caught:
        client(state).responses.create(model="tiny", input="Go on", previous_response_id="resp_1")
    error = caught.value.body
    assert error["param"] == "previous_response_id"
    assert "keeps no responses" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "text": {"verbosity": "high"}}, "text.verbosity"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        (
            {
                "input": "Hi",
                "tools": [WEATHER],
                "tool_choice": "required",
                "text": {"format": {"type": "json_object"}},
            },
            "tool_choice",
        ),
    ],
)
def test_fields_baton_cannot_honour_are_400s_naming_them(scripted, body, param):
    state, _ = scripted
    reply = httpx.post(f"{base_url(state)}/v1/responses", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_thinking_is_a_reasoning_item_before_the_message(think_checkpoint):
    tokenizer = Tokenizer.from_pretrained(think_checkpoint)
    thought, answer = "Let me look outside.", "It is not raining."
    text = f"<think>{thought}</think>{answer}"
    executor = ScriptedExecutor(tokenizer.vocab_size, tokenizer.eos_token_id)
    executor.answer = tokenizer.encode(text, add_special_tokens=False)
    engine = simulated_engine(think_checkpoint, executor)
    with running_server(engine, model_name="tiny", reasoning_parser="qwen3") as state:
        api = client(state)
        response = api.responses.create(model="tiny", input="Is it raining?")
        events = list(api.responses.create(model="tiny", input="Is it raining?", stream=True))
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == thought
    assert message.type == "message" and response.output_text == answer
    types = collapsed([event.type for event in events])
    assert types[2:8] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert types[8:] == [*TEXT_EVENTS[2:], "response.completed"]
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == answer


# --- a random-weight model under a grammar -----------------------------------------------


@pytest.fixture(scope="module")
def model_server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=256, max_num_seqs=8)
    with running_server(engine, model_name="tiny") as state:
        yield state


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_text_format_gives_valid_json(model_server, stream):
    text = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    api = client(model_server)
    fields = {"model": "tiny", "input": "A person", "text": text, "temperature": 1.0}
    if stream:
        events = list(api.responses.create(**fields, max_output_tokens=96, stream=True))
        response = events[-1].response
    else:
        response = api.responses.create(**fields, max_output_tokens=96)
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text.format.type == "json_schema"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_function_call_is_a_valid_function_call_item(model_server, tool_choice):
    response = client(model_server).responses.create(
        model="tiny",
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        temperature=1.0,
        max_output_tokens=96,
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
