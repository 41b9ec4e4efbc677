"""Request tracing: each engine request's span tree (queue, prefill chunks, decode), its GenAI and
Baton attributes, preemption events, errors, engine-clock TTFT, and W3C traceparent continuation
over HTTP and WebSocket, read from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest
import websockets
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.server_harness import (
    FAULTY_TOKEN,
    ControlledExecutor,
    base_url,
    running_server,
    simulated_engine,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


def roots(exporter: InMemorySpanExporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


def children(exporter: InMemorySpanExporter, root) -> list:
    spans = exporter.get_finished_spans()
    return [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]


def stream_chat(url: str, content: str, max_tokens: int, headers: dict | None = None) -> list:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(orjson.loads(line[6:]))
    return chunks


def test_streamed_chat_request_has_one_server_span_with_queue_prefill_and_decode(
    llama_checkpoint, exporter
):
    engine = simulated_engine(llama_checkpoint, max_num_batched_tokens=8)
    with running_server(engine, span_exporter=exporter, ttft_slo_ms=60_000) as state:
        chunks = stream_chat(base_url(state), "tell me a story about tracing", 12)
    timing = chunks[-1]["timing"]
    [root] = roots(exporter)
    assert root.name == "chat tiny"
    assert root.status.status_code is StatusCode.UNSET
    attributes = root.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.request.max_tokens"] == 12
    assert attributes["gen_ai.request.temperature"] == 1.0
    assert attributes["gen_ai.usage.output_tokens"] == 12
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert attributes["baton.policy"] == state.engine.engine.config.scheduling_policy
    assert attributes["baton.preemptions"] == 0
    assert attributes["baton.slo.met"] is True
    for key in ("queue_ms", "ttft_ms", "tpot_ms"):
        assert attributes[f"baton.{key}"] == pytest.approx(timing[key])
    assert attributes["baton.itl_p99_ms"] >= 0

    spans = children(exporter, root)
    names = [s.name for s in spans]
    assert names.count("queue") == 1 and names.count("decode") == 1
    prefills = [s for s in spans if s.name == "prefill"]
    # The chat-templated prompt is longer than the 8-token budget, so it came in chunks.
    prompt_tokens = attributes["gen_ai.usage.input_tokens"]
    assert len(prefills) == -(-prompt_tokens // 8)
    assert sum(s.attributes["baton.prefill.tokens"] for s in prefills) == prompt_tokens
    queue = next(s for s in spans if s.name == "queue")
    decode = next(s for s in spans if s.name == "decode")
    assert root.start_time == queue.start_time <= queue.end_time <= prefills[0].start_time
    assert prefills[-1].end_time <= decode.start_time <= decode.end_time == root.end_time
    assert decode.attributes["baton.decode.tokens"] == 11
    assert (decode.start_time - root.start_time) / 1e6 == pytest.approx(timing["ttft_ms"], abs=1e-3)


def test_cancelled_request_span_ends_with_cancelled_and_no_error(llama_checkpoint, exporter):
    engine = simulated_engine(llama_checkpoint)
    executor = ControlledExecutor(4096, 16, engine.vocab_size)
    engine.executor = executor

    async def cancel_midway(url: str) -> dict:
        async with websockets.connect(url) as ws:
            generate = {"type": "generate", "id": 1, "prompt": "hello", "max_tokens": 500}
            await ws.send(orjson.dumps({**generate, "ignore_eos": True}).decode())
            await ws.recv()  # the first token: the request is running
            executor.running.clear()  # hold it there until the cancel is in
            await ws.send(orjson.dumps({"type": "cancel", "id": 1}).decode())
            await asyncio.sleep(0.05)
            executor.running.set()
            while True:
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
                if frame["type"] == "done":
                    return frame

    with running_server(engine, span_exporter=exporter) as state:
        done = asyncio.run(cancel_midway(f"ws://127.0.0.1:{state.settings.port}/v1/ws"))
    assert done["finish_reason"] == "cancelled"
    [root] = roots(exporter)
    assert root.name == "text_completion tiny"
    assert root.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert root.attributes["gen_ai.usage.output_tokens"] == done["usage"]["completion_tokens"]
    assert root.status.status_code is StatusCode.UNSET
    assert "baton.slo.met" not in root.attributes


def test_preempted_request_span_has_preemption_and_resumption_events(llama_checkpoint, exporter):
    # Six blocks of 16: two requests of 20 + 60 tokens cannot both hold their 5 blocks.
    engine = simulated_engine(llama_checkpoint, num_kv_blocks=6, block_size=16)
    executor = ControlledExecutor(6, 16, engine.vocab_size)
    engine.executor = executor
    prompts = [[5 + i] * 20 for i in range(2)]
    with running_server(engine, span_exporter=exporter) as state:
        executor.running.clear()  # both requests are in before either decodes
        url = base_url(state)

        def complete(prompt):
            body = {"prompt": prompt, "max_tokens": 60, "ignore_eos": True}
            return httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()

        threads = [threading.Thread(target=complete, args=(p,)) for p in prompts]
        for thread in threads:
            thread.start()
        while state.engine.num_in_flight < 2:
            time.sleep(0.01)
        executor.running.set()
        for thread in threads:
            thread.join()
    preempted = [r for r in roots(exporter) if r.attributes["baton.preemptions"] > 0]
    assert preempted, "the tiny pool should have forced a preemption"
    root = preempted[0]
    events = [e.name for e in root.events]
    assert events.count("preempted") == root.attributes["baton.preemptions"]
    assert events.count("resumed") == root.attributes["baton.preemptions"]
    preempted_at = next(e.timestamp for e in root.events if e.name == "preempted")
    resumed_at = next(e.timestamp for e in root.events if e.name == "resumed")
    assert root.start_time < preempted_at <= resumed_at < root.end_time
    recomputes = [
        s
        for s in children(exporter, root)
        if s.name == "prefill" and s.attributes["baton.prefill.recompute"]
    ]
    assert recomputes and recomputes[0].start_time >= resumed_at
    assert root.attributes["gen_ai.usage.output_tokens"] == 60


def test_failed_request_span_has_error_status_and_exception_event(llama_checkpoint, exporter):
    engine = simulated_engine(llama_checkpoint)
    engine.executor = ControlledExecutor(4096, 16, engine.vocab_size)
    with running_server(engine, span_exporter=exporter) as state:
        body = {"prompt": [FAULTY_TOKEN, 5, 6], "max_tokens": 4}
        response = httpx.post(f"{base_url(state)}/v1/completions", json=body, timeout=30)
    assert response.status_code == 500
    [root] = roots(exporter)
    assert root.status.status_code is StatusCode.ERROR
    assert "injected fault" in root.status.description
    [event] = [e for e in root.events if e.name == "exception"]
    assert "injected fault" in event.attributes["exception.message"]
    assert root.attributes["gen_ai.response.finish_reasons"] == ("error",)


def test_span_ttft_equals_the_ttft_the_client_observed(llama_checkpoint, exporter):
    engine = simulated_engine(llama_checkpoint)
    executor = ControlledExecutor(4096, 16, engine.vocab_size)
    engine.executor = executor
    with running_server(engine, span_exporter=exporter) as state:
        body = {"prompt": "x y z", "max_tokens": 3, "ignore_eos": True, "stream": True}
        first = None
        with httpx.Client(base_url=base_url(state)) as client:
            client.get("/health")  # the connection is open before the clock starts
            executor.running.clear()
            sent = time.perf_counter()
            threading.Timer(0.3, executor.running.set).start()
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.perf_counter()
    client_ttft_ms = (first - sent) * 1e3
    [root] = roots(exporter)
    # The server's interval sits inside the client's: loopback and the SSE write are the gap.
    assert client_ttft_ms >= 300
    assert root.attributes["baton.ttft_ms"] <= client_ttft_ms
    assert client_ttft_ms - root.attributes["baton.ttft_ms"] < 25


def test_traceparent_header_is_continued_over_http(llama_checkpoint, exporter):
    with running_server(simulated_engine(llama_checkpoint), span_exporter=exporter) as state:
        stream_chat(base_url(state), "hi", 2, headers={"traceparent": TRACEPARENT})
        stream_chat(base_url(state), "hi", 2, headers={"traceparent": "00-garbage"})
    continued, fresh = roots(exporter)
    assert format(continued.context.trace_id, "032x") == TRACE_ID
    assert format(continued.parent.span_id, "016x") == PARENT_SPAN_ID
    assert continued.parent.is_remote
    assert fresh.parent is None and format(fresh.context.trace_id, "032x") != TRACE_ID


def test_traceparent_field_of_a_websocket_frame_is_continued(llama_checkpoint, exporter):
    async def generate(url: str) -> None:
        async with websockets.connect(url) as ws:
            frame = {"type": "generate", "id": "a", "prompt": "hi", "max_tokens": 2}
            await ws.send(orjson.dumps({**frame, "traceparent": TRACEPARENT}).decode())
            while orjson.loads(await asyncio.wait_for(ws.recv(), 10))["type"] != "done":
                pass

    with running_server(simulated_engine(llama_checkpoint), span_exporter=exporter) as state:
        asyncio.run(generate(f"ws://127.0.0.1:{state.settings.port}/v1/ws"))
    [root] = roots(exporter)
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_SPAN_ID


def test_tracing_is_off_without_an_exporter(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    with running_server(engine) as state:
        httpx.post(f"{base_url(state)}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert state.tracing is None
        # Nothing that builds spans listens to the engine.
        owners = {
            type(getattr(listener, "__self__", None)).__name__
            for listener in engine.finish_listeners
        }
        assert "Tracing" not in owners
