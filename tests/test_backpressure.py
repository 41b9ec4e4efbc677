"""Backpressure: past `max_num_seqs + --max-queued-requests` requests in flight the server answers
429 with a whole-second Retry-After, before reading or tokenizing the request, and serves again
once the queue drains; Retry-After is the queue's drain time at the recent completion rate."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

import baton.app.engine.async_engine
from baton.app.engine.async_engine import MAX_RETRY_AFTER_S, AsyncEngine
from baton.app.engine.client import QueueFullError
from baton.core.batch import Batch, ExecutorOutput
from baton.core.engine import Engine
from baton.core.simulation.simulated_executor import SimulatedExecutor
from baton.core.text.tokenizer import Tokenizer
from tests.factory import make_request
from tests.server_harness import base_url, running_server, simulated_engine

GATE_TIMEOUT_S = 20


class GatedExecutor(SimulatedExecutor):
    """Instant tokens, but no step runs while the gate is shut: requests stay in flight."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(num_kv_blocks=1024, block_size=16, vocab_size=vocab_size)
        self.gate = threading.Event()

    def execute(self, batch: Batch) -> ExecutorOutput:
        if not self.gate.wait(GATE_TIMEOUT_S):
            raise TimeoutError("the test never opened the gate")
        return super().execute(batch)


def gated_engine(checkpoint, max_num_seqs: int) -> tuple[Engine, threading.Event]:
    vocab_size = Tokenizer.from_pretrained(checkpoint).vocab_size
    executor = GatedExecutor(vocab_size)
    return simulated_engine(checkpoint, executor, max_num_seqs=max_num_seqs), executor.gate


def stream_in_background(url: str, results: list) -> threading.Thread:
    def run() -> None:
        body = {"prompt": "hello", "max_tokens": 4, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
            results.append((response.status_code, [line for line in response.iter_lines() if line]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(condition, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def test_full_queue_answers_429_with_retry_after_then_recovers(llama_checkpoint):
    engine, gate = gated_engine(llama_checkpoint, max_num_seqs=1)
    with running_server(engine, max_queued_requests=1) as state:
        url = base_url(state)
        results: list = []
        streams = [stream_in_background(url, results) for _ in range(2)]
        wait_for(lambda: state.engine.num_in_flight == 2)

        for path in ("/v1/completions", "/v1/chat/completions"):
            refused = httpx.post(f"{url}{path}", json={"prompt": "hi", "messages": []})
            assert refused.status_code == 429
            assert refused.json()["error"]["type"] == "rate_limit_error"
            retry_after = refused.headers["retry-after"]
            assert retry_after.isdigit() and 1 <= int(retry_after) <= MAX_RETRY_AFTER_S
        # Decided before the body is read: even malformed JSON gets the 429, not a 400.
        malformed = httpx.post(f"{url}/v1/completions", content=b"{not json")
        assert malformed.status_code == 429

        gate.set()
        for stream in streams:
            stream.join(GATE_TIMEOUT_S)
        assert [status for status, _ in results] == [200, 200]
        assert all(lines[-1] == "data: [DONE]" for _, lines in results)
        served = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert served.status_code == 200
        assert served.json()["choices"][0]["finish_reason"] == "length"


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def test_retry_after_is_the_drain_time_at_the_recent_completion_rate(llama_checkpoint, monkeypatch):
    clock = FakeClock(1000.0)
    monkeypatch.setattr(
        baton.app.engine.async_engine, "time", SimpleNamespace(monotonic=clock.monotonic)
    )
    engine, gate = gated_engine(llama_checkpoint, max_num_seqs=2)
    bridge = AsyncEngine(engine, max_queued_requests=2)

    async def finish_one(request_id: str) -> None:
        request = make_request(request_id, [5, 6, 7], max_tokens=1, ignore_eos=True)
        (stream,) = bridge.submit([request])
        async for _ in stream:
            pass

    async def scenario() -> tuple[int, int]:
        bridge.start()
        gate.set()
        # 10 completions over 30 s: one every 3 s.
        for index in range(10):
            clock.now += 3.0
            await finish_one(f"done-{index}")
        gate.clear()
        held = [asyncio.ensure_future(finish_one(f"held-{i}")) for i in range(4)]
        while bridge.num_in_flight < 4:
            await asyncio.sleep(0.001)
        with pytest.raises(QueueFullError) as paced:
            bridge.check_capacity()
        # A minute with nothing finished: the estimate grows to the cap.
        clock.now += 60.0
        with pytest.raises(QueueFullError) as stalled:
            bridge.check_capacity()
        gate.set()
        await asyncio.gather(*held)
        bridge.check_capacity()
        return paced.value.retry_after_s, stalled.value.retry_after_s

    try:
        paced, stalled = asyncio.run(scenario())
    finally:
        gate.set()
        bridge.stop(5)
    # Two queued beyond the two running slots, at one completion per 3 s.
    assert paced == 6
    assert stalled == MAX_RETRY_AFTER_S
