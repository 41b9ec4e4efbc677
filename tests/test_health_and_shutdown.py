"""Health tracks the step thread (503 before it runs and after it dies, when in-flight streams get
an error), and SIGTERM shuts `baton serve` down gracefully: no new connections, running streams
finish or, at --shutdown-timeout, end cancelled with a final chunk, and the process exits 0."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from starlette.testclient import TestClient
from websockets.sync.client import connect

from app.async_engine import AsyncEngine
from app.server import ServerState, create_app
from app.settings import ServerSettings
from tests.server_harness import base_url, free_port, running_server, simulated_engine

REPO = Path(__file__).resolve().parent.parent
SHUTDOWN_TIMEOUT_S = 2.0


class StepThreadKilled(BaseException):
    """Not an Exception, so the step loop's per-step recovery cannot catch it."""


def test_health_is_503_until_the_engine_runs_and_after_it_stops(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    state = ServerState(AsyncEngine(engine, 8), engine.tokenizer, "tiny", ServerSettings())
    app = create_app(state)
    # A loopback name as Host: the server answers no other (TestClient's default is testserver).
    url = "http://127.0.0.1"
    # Without the lifespan the step thread never starts.
    before = TestClient(app, base_url=url).get("/health")
    assert before.status_code == 503
    assert before.json()["error"]["type"] == "service_unavailable"
    with TestClient(app, base_url=url) as client:
        assert client.get("/health").json() == {"status": "ok"}
    assert TestClient(app, base_url=url).get("/health").status_code == 503


def sse_payloads(lines: list[str]) -> list[dict | str]:
    payloads: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            payloads.append(data if data == "[DONE]" else orjson.loads(data))
    return payloads


def test_step_thread_death_fails_streams_and_turns_health_503(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    real_step = engine.step
    calls = 0

    def dying_step():
        nonlocal calls
        calls += 1
        if calls > 5:
            raise StepThreadKilled("injected: the executor crashed for good")
        return real_step()

    engine.step = dying_step
    with running_server(engine) as state:
        url = base_url(state)
        assert httpx.get(f"{url}/health").status_code == 200
        body = {"prompt": "hello", "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as response:
            assert response.status_code == 200
            payloads = sse_payloads(list(response.iter_lines()))
        tokens, error, done = payloads[:-2], payloads[-2], payloads[-1]
        assert tokens and all(chunk["choices"][0]["finish_reason"] is None for chunk in tokens)
        assert error["error"]["type"] == "service_unavailable"
        assert "executor crashed for good" in error["error"]["message"]
        assert done == "[DONE]"

        health = httpx.get(f"{url}/health")
        assert health.status_code == 503
        assert "engine stopped" in health.json()["error"]["message"]
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "service_unavailable"


@pytest.fixture(scope="module")
def long_context_checkpoint(make_checkpoint) -> Path:
    # Long enough that a stream outlasts the shutdown timeout on a fast CPU.
    return make_checkpoint("llama", max_position_embeddings=8192)


@contextlib.contextmanager
def baton_serve(checkpoint: Path, port: int, log: Path) -> Iterator[subprocess.Popen]:
    command = [sys.executable, "-m", "app.cli", "serve", "--model", str(checkpoint)]
    command += ["--device", "cpu", "--port", str(port)]
    command += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "baton serve did not come up"
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


class Stream:
    """A streaming completion read on its own thread; `started` once its first token arrives."""

    def __init__(self, port: int, max_tokens: int) -> None:
        self.body = {
            "prompt": "hello",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.lines: list[str] = []
        self.started = threading.Event()
        self.ended_at = 0.0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=30) as response:
            for line in response.iter_lines():
                if not line:
                    continue
                self.lines.append(line)
                if line.startswith("data: {"):
                    self.started.set()
        self.ended_at = time.monotonic()

    def finish_reason(self) -> str | None:
        chunks = [p for p in sse_payloads(self.lines) if isinstance(p, dict) and p["choices"]]
        return chunks[-1]["choices"][0]["finish_reason"]


class WebSocketStream:
    """A long generate over /v1/ws, read on its own thread until its done frame."""

    def __init__(self, port: int, max_tokens: int) -> None:
        self.url = f"ws://127.0.0.1:{port}/v1/ws"
        self.frame = {
            "type": "generate",
            "id": 1,
            "prompt": "hello",
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        self.frames: list[dict] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with connect(self.url) as socket:
            socket.send(json.dumps(self.frame))
            while True:
                frame = json.loads(socket.recv(timeout=30))
                self.frames.append(frame)
                self.started.set()
                if frame["type"] != "token":
                    return


@pytest.mark.slow
def test_sigterm_finishes_short_streams_cancels_long_ones_and_exits_0(
    long_context_checkpoint, tmp_path
):
    port = free_port()
    with baton_serve(long_context_checkpoint, port, tmp_path / "serve.log") as process:
        long = Stream(port, max_tokens=8000)
        short = Stream(port, max_tokens=64)
        socket_stream = WebSocketStream(port, max_tokens=8000)
        assert long.started.wait(30) and short.started.wait(30) and socket_stream.started.wait(30)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        refused_at = None
        while refused_at is None and time.monotonic() - signalled < 2:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            except httpx.ConnectError:
                refused_at = time.monotonic()
        assert refused_at is not None, "new connections were still accepted"
        assert refused_at - signalled < 1.0

        exit_code = process.wait(SHUTDOWN_TIMEOUT_S + 5)
        exited = time.monotonic()
        long.thread.join(5)
        short.thread.join(5)
        socket_stream.thread.join(5)
        log = (tmp_path / "serve.log").read_text()
        assert exit_code == 0, log

    assert short.finish_reason() == "length"
    assert short.lines[-1] == "data: [DONE]"
    assert long.finish_reason() == "cancelled"
    assert long.lines[-1] == "data: [DONE]"
    # WebSocket streams get the same grace period and end with a done frame, not a cut socket.
    assert socket_stream.frames[-1]["type"] == "done"
    assert socket_stream.frames[-1]["finish_reason"] == "cancelled"
    assert len(socket_stream.frames) > SHUTDOWN_TIMEOUT_S
    # Refused while the long stream was still being served; cut only at the timeout.
    assert refused_at < long.ended_at
    assert SHUTDOWN_TIMEOUT_S - 0.5 < long.ended_at - signalled < SHUTDOWN_TIMEOUT_S + 2
    assert exited - signalled < SHUTDOWN_TIMEOUT_S + 5
