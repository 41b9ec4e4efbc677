"""The WebSocket protocol at /v1/ws, driven by the `websockets` client: requests multiplexed on
one socket with one cancelled, error frames for bad frames on a socket that stays usable, and a
closed socket that aborts its requests and gives back their KV blocks."""

from __future__ import annotations

import asyncio
import contextlib
import time

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.server_harness import ControlledExecutor, model_engine, running_server, simulated_engine

PROMPTS = [f"The for statement, part {i}" for i in range(8)]
GREEDY = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=256)
    with running_server(engine, model_name="tiny") as state:
        yield state


@pytest.fixture(scope="module")
def simulated_server(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint, max_num_seqs=2)
    engine.executor = ControlledExecutor(4096, 16, engine.vocab_size)
    with running_server(engine, model_name="tiny", max_queued_requests=1) as state:
        yield state


def ws_url(state) -> str:
    return f"ws://127.0.0.1:{state.settings.port}/v1/ws"


async def send(ws: ClientConnection, frame: dict) -> None:
    await ws.send(orjson.dumps(frame).decode())


async def receive(ws: ClientConnection) -> dict:
    return orjson.loads(await asyncio.wait_for(ws.recv(), timeout=10))


async def run_to_end(ws: ClientConnection, ids: set) -> dict[object, list[dict]]:
    """Every frame per request id until each has its `done` or `error`."""
    frames: dict[object, list[dict]] = {i: [] for i in ids}
    open_ids = set(ids)
    while open_ids:
        frame = await receive(ws)
        frames[frame["id"]].append(frame)
        if frame["type"] in ("done", "error"):
            open_ids.discard(frame["id"])
    return frames


def text_of(frames: list[dict]) -> str:
    tokens = [f for f in frames if f["type"] == "token"]
    assert [f["index"] for f in tokens] == list(range(len(tokens)))
    return "".join(f["text"] for f in tokens)


async def solo(state, prompt: str) -> str:
    async with connect(ws_url(state)) as ws:
        await send(ws, {"type": "generate", "id": "solo", "prompt": prompt, **GREEDY})
        frames = (await run_to_end(ws, {"solo"}))["solo"]
        assert frames[-1]["type"] == "done" and frames[-1]["finish_reason"] == "length"
        return text_of(frames)


def test_eight_multiplexed_requests_with_one_cancelled(model_server):
    cancelled = 3
    long = {**GREEDY, "max_tokens": 900}

    async def run():
        alone = [await solo(model_server, p) for p in PROMPTS]
        async with connect(ws_url(model_server)) as ws:
            for i, prompt in enumerate(PROMPTS):
                params = long if i == cancelled else GREEDY
                await send(ws, {"type": "generate", "id": i, "prompt": prompt, **params})
            frames: dict[int, list[dict]] = {i: [] for i in range(8)}
            while not any(f["type"] == "token" for f in frames[cancelled]):
                frame = await receive(ws)
                frames[frame["id"]].append(frame)
            await send(ws, {"type": "cancel", "id": cancelled})
            open_ids = {i for i in frames if not frames[i] or frames[i][-1]["type"] == "token"}
            for i, rest in (await run_to_end(ws, open_ids)).items():
                frames[i].extend(rest)
        return alone, frames

    alone, frames = asyncio.run(run())
    done = frames[cancelled][-1]
    assert done["type"] == "done" and done["finish_reason"] == "cancelled"
    assert 0 < done["usage"]["completion_tokens"] < 900
    assert set(done["timing"]) >= {"queue_ms", "ttft_ms", "tpot_ms", "e2e_ms"}
    for i in set(range(8)) - {cancelled}:
        assert frames[i][-1]["type"] == "done" and frames[i][-1]["finish_reason"] == "length"
        assert frames[i][-1]["usage"]["completion_tokens"] == GREEDY["max_tokens"]
        assert text_of(frames[i]) == alone[i]


def test_chat_messages_over_the_socket(model_server):
    async def run():
        async with connect(ws_url(model_server)) as ws:
            messages = [{"role": "user", "content": "hello"}]
            await send(ws, {"type": "generate", "id": "c", "messages": messages, **GREEDY})
            return (await run_to_end(ws, {"c"}))["c"]

    frames = asyncio.run(run())
    expected = len(model_server.tokenizer.encode_chat([{"role": "user", "content": "hello"}]))
    assert frames[-1]["usage"]["prompt_tokens"] == expected
    assert len(text_of(frames)) > 0


def test_closing_the_socket_aborts_its_requests_and_frees_their_blocks(model_server):
    core = model_server.engine.engine
    usage_before = core.kv_cache.usage

    async def run():
        async with connect(ws_url(model_server)) as ws:
            for i in range(4):
                params = {**GREEDY, "max_tokens": 900}
                await send(ws, {"type": "generate", "id": i, "prompt": PROMPTS[i], **params})
            started = set()
            while len(started) < 4:
                started.add((await receive(ws))["id"])
            assert core.num_running + core.num_waiting == 4

    asyncio.run(run())
    deadline = time.monotonic() + 2
    while model_server.engine.num_in_flight or core.num_running or core.num_waiting:
        assert time.monotonic() < deadline, "the closed socket's requests are still running"
        time.sleep(0.01)
    assert core.kv_cache.usage == usage_before


BAD_FRAMES = [
    ("{not json", None, None, "JSON"),
    ("[1, 2]", None, None, "object"),
    ('{"type": "generate", "id": "\\ud800", "prompt": "x"}', None, None, "JSON"),
    ('{"type": "launch", "id": 1, "prompt": "x"}', 1, "type", "generate"),
    ('{"id": 1, "prompt": "x"}', 1, "type", "generate"),
    ('{"type": "generate", "prompt": "x"}', None, "id", "id"),
    ('{"type": "generate", "id": true, "prompt": "x"}', None, "id", "id"),
    ('{"type": "generate", "id": 2}', 2, None, "prompt or messages"),
    ('{"type": "generate", "id": 3, "prompt": "x", "temperature": -1}', 3, "temperature", "100]"),
    ('{"type": "generate", "id": 4, "prompt": "x", "max_tokens": "9"}', 4, "max_tokens", "integer"),
    ('{"type": "generate", "id": 5, "prompt": ["a", "b"]}', 5, "prompt", "one prompt"),
    ('{"type": "generate", "id": 6, "prompt": [100000]}', 6, "prompt", "vocabulary"),
    ('{"type": "generate", "id": 7, "prompt": "x", "model": "gpt"}', 7, "model", "gpt"),
    ('{"type": "generate", "id": 8, "messages": []}', 8, "messages", "empty"),
]


def test_bad_frames_get_error_frames_and_the_socket_stays_usable(simulated_server):
    async def run():
        async with connect(ws_url(simulated_server)) as ws:
            for raw, client_id, param, hint in BAD_FRAMES:
                await ws.send(raw)
                frame = await receive(ws)
                assert frame["type"] == "error" and frame["id"] == client_id, (raw, frame)
                assert set(frame["error"]) == {"message", "type", "param", "code"}
                kind = "not_found_error" if param == "model" else "invalid_request_error"
                assert frame["error"]["type"] == kind
                assert frame["error"]["param"] == param, (raw, frame)
                assert hint in frame["error"]["message"], (raw, frame)
            await send(ws, {"type": "cancel", "id": "never-sent"})  # ignored: nothing in flight
            await send(ws, {"type": "generate", "id": "ok", "prompt": "x", "max_tokens": 3})
            return (await run_to_end(ws, {"ok"}))["ok"]

    frames = asyncio.run(run())
    assert frames[-1]["type"] == "done"
    assert frames[-1]["usage"]["completion_tokens"] <= 3


def test_duplicate_ids_in_flight_and_capacity_are_refused_per_request(simulated_server):
    executor = simulated_server.engine.engine.executor

    async def run():
        async with connect(ws_url(simulated_server)) as ws:
            with contextlib.ExitStack() as held:
                executor.running.clear()  # steps wait: requests stay in flight
                held.callback(executor.running.set)
                body = {"type": "generate", "prompt": "x", "max_tokens": 2}
                # max_num_seqs (2) + max_queued_requests (1) fill the server.
                for i in range(3):
                    await send(ws, {**body, "id": i})
                while simulated_server.engine.num_in_flight < 3:
                    await asyncio.sleep(0.01)
                await send(ws, {**body, "id": 0})
                duplicate = await receive(ws)
                await send(ws, {**body, "id": 9})
                refused = await receive(ws)
            return duplicate, refused, await run_to_end(ws, {0, 1, 2})

    duplicate, refused, finished = asyncio.run(run())
    assert duplicate["id"] == 0 and duplicate["error"]["param"] == "id"
    assert "in flight" in duplicate["error"]["message"]
    assert refused["id"] == 9 and refused["error"]["type"] == "rate_limit_error"
    assert refused["error"]["code"] == "rate_limit_error"
    assert all(frames[-1]["type"] == "done" for frames in finished.values())
