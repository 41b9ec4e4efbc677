"""Hang-ups abort their requests: a client that disconnects before its first token, during
prefill or during decode leaves nothing running and the KV cache as it was, 1,000 times over."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from tests.server_harness import paced_executor, running_server, simulated_engine

HANG_UPS = 1000
CONCURRENCY = 25


async def hang_up(port: int, body: bytes, after_events: int) -> None:
    """Send a streaming request and drop the connection after `after_events` SSE events."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    seen = 0
    while seen < after_events:
        line = await reader.readline()
        if not line:
            break
        seen += line.startswith(b"data: {")
    writer.transport.abort()


async def hang_up_many(port: int, cases: list[tuple[bytes, int]]) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(body: bytes, after: int) -> None:
        async with limit:
            await hang_up(port, body, after)

    await asyncio.gather(*(one(body, after) for body, after in cases))


def wait_until_idle(state, timeout: float = 20.0) -> None:
    core = state.engine.engine
    deadline = time.monotonic() + timeout
    while state.engine.num_in_flight or core.num_running or core.num_waiting:
        assert time.monotonic() < deadline, (
            f"in flight {state.engine.num_in_flight}, running {core.num_running}, "
            f"waiting {core.num_waiting}"
        )
        time.sleep(0.01)


@pytest.mark.slow
def test_thousand_hang_ups_before_first_token_during_prefill_and_decode_leak_nothing(
    llama_checkpoint,
):
    engine = simulated_engine(
        llama_checkpoint, max_num_batched_tokens=64, num_kv_blocks=2048, block_size=16
    )
    engine.executor = paced_executor(2048, engine.vocab_size, step_s=0.0005)
    long_prompt = " ".join(["statement"] * 300)

    def body(prompt: str) -> bytes:
        return orjson.dumps(
            {
                "model": "tiny",
                "prompt": prompt,
                "stream": True,
                "max_tokens": 200,
                "ignore_eos": True,
            }
        )

    cases = []
    for i in range(HANG_UPS):
        mode = i % 3
        if mode == 0:
            cases.append((body("The for statement"), 0))  # before the first token
        elif mode == 1:
            cases.append((body(long_prompt), 0))  # mid-prefill: 300+ tokens, 64 per step
        else:
            cases.append((body("The for statement"), 5))  # during decode
    with running_server(engine) as state:
        free_before = engine.kv_cache.pool.num_free_blocks
        asyncio.run(hang_up_many(state.settings.port, cases))
        wait_until_idle(state)
        assert engine.kv_cache.pool.num_free_blocks == free_before
        assert engine.kv_cache.usage == 0.0
        assert engine.scheduler.requests == {}
        assert state.engine.healthy
