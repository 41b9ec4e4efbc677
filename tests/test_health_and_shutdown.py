"""Health tracks the step thread (503 before it runs and after it dies, when in-flight streams get
an error), and SIGTERM shuts `baton serve` down gracefully: no new connections, running streams
finish or, at --shutdown-timeout, end cancelled with a final chunk, and the process exits 0."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
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

import tests.server_harness
from baton.app.engine.async_engine import AsyncEngine
from baton.app.http.graceful_shutdown import drain_s
from baton.app.http.server import ServerState, create_app
from baton.app.settings import ServerSettings
from tests.server_harness import (
    base_url,
    free_port,
    running_server,
    simulated_engine,
    wait_until_healthy,
)

REPO = Path(__file__).resolve().parent.parent
SHUTDOWN_TIMEOUT_S = 2.0
# `baton serve`'s is longer, so its drain fits a short stream that outlasts uvicorn's 0.1 s
# wait before it sees the signal and still ends there if a busy CPU's steps slow several-fold.
SERVE_SHUTDOWN_TIMEOUT_S = 4.0
# The share of that drain the short stream takes at the step pace measured before it starts.
SHORT_STREAM_SHARE_OF_DRAIN = 1 / 8


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
        # The exception's own text stays in the server log.
        assert "server log" in error["error"]["message"]
        assert "executor crashed for good" not in error["error"]["message"]
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
    return make_checkpoint("llama", max_position_embeddings=16384)


@contextlib.contextmanager
def baton_serve(checkpoint: Path, port: int, log: Path, *flags: str) -> Iterator[subprocess.Popen]:
    command = [sys.executable, "-m", "baton.app.cli", "serve", "--model", str(checkpoint)]
    command += ["--device", "cpu", "--port", str(port), *flags]
    command += ["--shutdown-timeout", str(SERVE_SHUTDOWN_TIMEOUT_S)]
    # One intra-op thread: on a busy CPU two wait for each other at every parallel region,
    # which slows a step far more than the CPU share it loses.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(process, port, log, timeout_s=60)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class Stream:
    """A streaming completion read on its own thread; `started` once its first token arrives,
    `token_times` when each token chunk did."""

    def __init__(self, port: int, max_tokens: int) -> None:
        self.body = {
            "prompt": "hello",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.lines: list[str] = []
        self.token_times: list[float] = []
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
                    self.token_times.append(time.monotonic())
                    self.started.set()
        self.ended_at = time.monotonic()

    def finish_reason(self) -> str | None:
        chunks = [p for p in sse_payloads(self.lines) if isinstance(p, dict) and p["choices"]]
        return chunks[-1]["choices"][0]["finish_reason"]


def step_s(port: int, min_steps: int = 5, min_s: float = 0.5) -> float:
    """Seconds per engine step, from the server's own step count over `min_s` and `min_steps`
    at least. Not from when chunks reach a client: a reader that falls behind on a busy CPU
    catches up in bursts, which read as steps many times faster than the server's."""

    def steps() -> tuple[float, int]:
        stats = httpx.get(f"http://127.0.0.1:{port}/v1/stats", timeout=10).json()
        return time.monotonic(), stats["steps"]["total"]

    began, first = steps()
    now, count = began, first
    while count < first + min_steps or now - began < min_s:
        time.sleep(0.05)
        now, count = steps()
    return (now - began) / (count - first)


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
        self.frame_times: list[float] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with connect(self.url) as socket:
            socket.send(json.dumps(self.frame))
            while True:
                frame = json.loads(socket.recv(timeout=30))
                self.frames.append(frame)
                self.frame_times.append(time.monotonic())
                self.started.set()
                if frame["type"] != "token":
                    return


@pytest.mark.slow
def test_sigterm_finishes_short_streams_cancels_long_ones_and_exits_0(
    long_context_checkpoint, tmp_path
):
    port = free_port()
    with baton_serve(long_context_checkpoint, port, tmp_path / "serve.log") as process:
        long = Stream(port, max_tokens=16000)
        socket_stream = WebSocketStream(port, max_tokens=16000)
        assert long.started.wait(30) and socket_stream.started.wait(30)
        # A step takes what this machine gives it, many times longer when it is busy: the short
        # stream's length in steps is set from the pace measured now.
        short_s = drain_s(SERVE_SHUTDOWN_TIMEOUT_S) * SHORT_STREAM_SHARE_OF_DRAIN
        short = Stream(port, max_tokens=max(2, round(short_s / step_s(port))))
        assert short.started.wait(30)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # Finishing it is then the drain's doing, not a race won before the signal.
        assert short.thread.is_alive(), "the short stream ended before SIGTERM"

        refused_at = None
        while refused_at is None and time.monotonic() - signalled < 2:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            except httpx.ConnectError:
                refused_at = time.monotonic()
        assert refused_at is not None, "new connections were still accepted"
        assert refused_at - signalled < 1.0

        exit_code = process.wait(SERVE_SHUTDOWN_TIMEOUT_S + 5)
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
    # Refused while the long stream was still being served; both cut near the end of the timeout.
    assert refused_at < long.ended_at
    for ended_at in (long.ended_at, socket_stream.frame_times[-1]):
        assert SERVE_SHUTDOWN_TIMEOUT_S / 2 < ended_at - signalled < SERVE_SHUTDOWN_TIMEOUT_S
    # The timeout bounds the whole drain; what is left is the process exiting.
    assert exited - signalled < SERVE_SHUTDOWN_TIMEOUT_S + 1
    assert "Traceback" not in log


# A chat template that renders for hours once a message is long enough to be tokenized on a
# worker thread (admission's MAX_INLINE_TOKENIZE_CHARS): a worker stuck past any timeout.
STUCK_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] | length > 5000 %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}{{ m['content'] }}{% endfor %}"
)


@pytest.mark.slow
def test_sigterm_exits_on_time_with_a_worker_thread_stuck(llama_checkpoint, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    with baton_serve(llama_checkpoint, port, log, "--chat-template", STUCK_TEMPLATE) as process:
        body = {"messages": [{"role": "user", "content": "a" * 6000}], "max_tokens": 2}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"

        def ask() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(url, json=body, timeout=30)

        stuck = threading.Thread(target=ask, daemon=True)
        stuck.start()
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        exit_code = process.wait(SERVE_SHUTDOWN_TIMEOUT_S + 10)
        exited = time.monotonic()
    text = log.read_text()
    assert exit_code == 0, text
    # The timeout from the signal; what is left is the process exiting.
    assert exited - signalled < SERVE_SHUTDOWN_TIMEOUT_S + 1, text
    [line] = [line for line in text.splitlines() if "--shutdown-timeout" in line]
    assert "exiting without waiting for the threads still running" in line
    assert "Traceback" not in text


def with_small_send_buffers(make_config):
    """`make_config` whose HTTP connections have a 4 KiB kernel send buffer, so a client that
    stops reading stalls the server's writes after some kilobytes, not the megabytes Linux
    would otherwise buffer on loopback."""

    def config(app, settings):
        made = make_config(app, settings)

        class SmallSendBuffer(made.http):
            def connection_made(self, transport) -> None:
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                super().connection_made(transport)

        made.http = SmallSendBuffer
        return made

    return config


def stalled_stream(port: int) -> socket.socket:
    """A streaming completion from a client that never reads its answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps({"prompt": "hello", "max_tokens": 4000, "ignore_eos": True, "stream": True})
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n"
    sock.sendall(head % len(body) + body)
    return sock


@contextlib.contextmanager
def stalled_websocket(port: int) -> Iterator[None]:
    """A WebSocket whose client stops reading after asking for a long generation."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    url = f"ws://127.0.0.1:{port}/v1/ws"
    # It will not read the close handshake either: it only drops the socket.
    with connect(url, sock=sock, max_queue=1, close_timeout=0) as ws:
        frame = {
            "type": "generate",
            "id": 1,
            "prompt": "hi",
            "max_tokens": 4000,
            "ignore_eos": True,
        }
        ws.send(json.dumps(frame))
        yield


def read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_shutdown_cuts_clients_that_stopped_reading_within_the_timeout_and_quietly(
    llama_checkpoint, monkeypatch, caplog, capfd
):
    make_config = with_small_send_buffers(tests.server_harness.uvicorn_config)
    monkeypatch.setattr(tests.server_harness, "uvicorn_config", make_config)
    engine = simulated_engine(llama_checkpoint)
    with contextlib.ExitStack() as clients:
        with running_server(engine, shutdown_timeout_s=SHUTDOWN_TIMEOUT_S) as state:
            port = state.settings.port
            stalled = [stalled_stream(port) for _ in range(3)]
            clients.enter_context(stalled_websocket(port))
            # Instant tokens fill the small buffers in well under this.
            time.sleep(0.5)
            assert state.engine.num_in_flight == 4
            shutting_down = time.monotonic()
        assert time.monotonic() - shutting_down < SHUTDOWN_TIMEOUT_S
        for sock in stalled:
            answer = read_to_end(sock)
            sock.close()
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert b"HTTP/1.1 500" not in answer and b"Internal Server Error" not in answer
    assert "Traceback" not in capfd.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
