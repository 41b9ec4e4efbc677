"""SSE framing checked byte by byte: `data: {json}\\n\\n` events, `text/event-stream`, the chat
role first, the usage chunk last, `data: [DONE]\\n\\n` at the end, and an error event (then
`[DONE]`) when the engine fails the request mid-stream."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.server_harness import (
    FAULTY_TOKEN,
    ControlledExecutor,
    base_url,
    running_server,
    simulated_engine,
)

DONE = b"data: [DONE]\n\n"


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    engine.executor = ControlledExecutor(4096, 16, engine.vocab_size)
    with running_server(engine, model_name="tiny") as state:
        yield state


def raw_stream(state, path: str, body: dict) -> tuple[httpx.Headers, bytes]:
    url = f"{base_url(state)}{path}"
    with httpx.stream("POST", url, json={"model": "tiny", "stream": True, **body}) as response:
        assert response.status_code == 200
        return response.headers, b"".join(response.iter_raw())


def events(raw: bytes) -> list[bytes]:
    """Split on the blank line that ends each event, insisting on exact framing."""
    assert raw.endswith(DONE)
    parts = raw.split(b"\n\n")
    assert parts[-1] == b""
    for part in parts[:-1]:
        assert part.startswith(b"data: "), part
        assert b"\n" not in part and b"\r" not in part, part
    return [part[len(b"data: ") :] for part in parts[:-1]]


def test_completion_stream_is_data_events_of_json_ending_in_done(server):
    headers, raw = raw_stream(
        server,
        "/v1/completions",
        {"prompt": "The for statement", "max_tokens": 20, "ignore_eos": True},
    )
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache"
    *payloads, done = events(raw)
    assert done == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "timing" in chunks[-1] and "usage" not in chunks[-1]


def test_chat_stream_opens_with_the_role_and_closes_with_usage(server):
    _, raw = raw_stream(
        server,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 5,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    *payloads, done = events(raw)
    assert done == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1])
    finish = chunks[-2]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert set(finish["timing"]) >= {"queue_ms", "ttft_ms", "tpot_ms", "e2e_ms"}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-1]["usage"]["total_tokens"] == chunks[-1]["usage"]["prompt_tokens"] + 5


def test_several_prompts_stream_chunks_tagged_with_their_choice_index(server):
    _, raw = raw_stream(
        server,
        "/v1/completions",
        {"prompt": ["one", "two", "three"], "max_tokens": 4, "ignore_eos": True},
    )
    chunks = [orjson.loads(p) for p in events(raw)[:-1]]
    finished = sorted(c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"])
    assert finished == [0, 1, 2]
    assert all(len(c["choices"]) == 1 for c in chunks)


def test_a_request_failing_in_the_engine_streams_an_error_event_then_done(server):
    _, raw = raw_stream(
        server, "/v1/completions", {"prompt": [FAULTY_TOKEN, 5, 6], "max_tokens": 4}
    )
    *payloads, done = events(raw)
    assert done == b"[DONE]"
    error = orjson.loads(payloads[-1])["error"]
    assert error["type"] == "server_error"
    assert "server log" in error["message"] and "injected fault" not in error["message"]
    # The server keeps serving.
    _, raw = raw_stream(server, "/v1/completions", {"prompt": "fine", "max_tokens": 2})
    assert raw.endswith(DONE)
