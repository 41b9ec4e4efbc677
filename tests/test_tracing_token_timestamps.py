"""Per-token timestamps to clients: with `return_token_timestamps`, the `timing` object of the
last SSE chunk, of a whole response and of the WebSocket `done` frame lists when each output
token was ready on the engine's clock."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
import websockets

from tests.server_harness import base_url, running_server, simulated_engine


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    with running_server(simulated_engine(llama_checkpoint)) as state:
        yield state


def check_token_ms(timing: dict, num_tokens: int) -> None:
    token_ms = timing["token_ms"]
    assert len(token_ms) == num_tokens
    assert token_ms[0] == pytest.approx(timing["ttft_ms"])
    assert token_ms == sorted(token_ms)
    assert token_ms[-1] == pytest.approx(timing["e2e_ms"])


def test_stream_and_whole_response_carry_token_times_only_when_asked(server):
    url = base_url(server)
    body = {"prompt": "when", "max_tokens": 6, "ignore_eos": True, "return_token_timestamps": True}
    whole = httpx.post(f"{url}/v1/completions", json=body).json()
    check_token_ms(whole["timing"], 6)
    chunks = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(orjson.loads(line[6:]))
    check_token_ms(chunks[-1]["timing"], 6)
    plain = httpx.post(f"{url}/v1/completions", json={**body, "return_token_timestamps": False})
    assert "token_ms" not in plain.json()["timing"]


def test_websocket_done_frame_carries_token_times(server):
    async def generate() -> dict:
        async with websockets.connect(f"ws://127.0.0.1:{server.settings.port}/v1/ws") as ws:
            frame = {"type": "generate", "id": 1, "prompt": "when", "max_tokens": 5}
            await ws.send(
                orjson.dumps(
                    {**frame, "ignore_eos": True, "return_token_timestamps": True}
                ).decode()
            )
            while True:
                message = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
                if message["type"] == "done":
                    return message

    done = asyncio.run(generate())
    check_token_ms(done["timing"], 5)
