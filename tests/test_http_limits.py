"""Header size limit, header timeout and body timeout (baton.app.http.http_limits) against a real
uvicorn on
loopback, driven byte by byte over raw sockets; streams and WebSockets that run past both
timeouts still complete."""

from __future__ import annotations

import json
import logging
import select
import socket
import time

import httpx
import orjson
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from baton.app.cli import build_parser, server_settings_from
from baton.app.settings import ServerSettings
from baton.core.simulation.simulated_executor import SimulatedExecutor
from tests.server_harness import base_url, running_server, simulated_engine

MAX_HEADER_BYTES = 4096
TIMEOUT_S = 0.5
# Each engine step takes this long, so a stream of a few dozen tokens outlasts both timeouts.
STEP_S = 0.02
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


class PacedExecutor(SimulatedExecutor):
    def execute(self, batch):
        time.sleep(STEP_S)
        return super().execute(batch)


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    engine.executor = PacedExecutor(4096, 16, engine.vocab_size)
    limits = {"header_timeout_s": TIMEOUT_S, "body_timeout_s": TIMEOUT_S}
    with running_server(engine, max_header_bytes=MAX_HEADER_BYTES, **limits) as state:
        yield state


@pytest.fixture
def quiet_server(server, caplog, capfd):
    """The server, and after the test a check that nothing logged an error or a traceback."""
    yield server
    # What the server does after the client saw the connection close comes a moment later.
    time.sleep(0.1)
    assert "Traceback" not in capfd.readouterr().err
    records = caplog.get_records("call") + caplog.get_records("teardown")
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []


def open_socket(state) -> socket.socket:
    return socket.create_connection(("127.0.0.1", state.settings.port), timeout=5)


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def send_until_answered(sock: socket.socket, pieces: int, piece: bytes, gap_s: float) -> None:
    """Send `piece` `pieces` times, `gap_s` apart, stopping once the server has answered."""
    for _ in range(pieces):
        sock.sendall(piece)
        readable, _, _ = select.select([sock], [], [], gap_s)
        if readable:
            return


def error_of(data: bytes, status: int) -> dict:
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    assert b"connection: close" in head.lower()
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_header_block_over_the_limit_gets_431_and_the_connection_closes(quiet_server):
    with open_socket(quiet_server) as sock:
        filler = b"a" * MAX_HEADER_BYTES
        sock.sendall(
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: " + filler + b"\r\n\r\n"
        )
        error = error_of(read_until_closed(sock), 431)
    assert error["code"] == "request_header_fields_too_large"
    assert f"{MAX_HEADER_BYTES} bytes" in error["message"]
    assert "--max-header-bytes" in error["message"]
    # Just under the limit is served.
    filler = "a" * (MAX_HEADER_BYTES - 200)
    health = httpx.get(f"{base_url(quiet_server)}/health", headers={"X-Filler": filler})
    assert health.status_code == 200


def test_a_header_that_never_ends_is_refused_before_it_is_held_whole(quiet_server):
    with open_socket(quiet_server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ")
        # At most 64 times the limit; the answer comes after about twice it.
        send_until_answered(sock, 256, b"a" * 1024, gap_s=0.005)
        error = error_of(read_until_closed(sock), 431)
    assert error["code"] == "request_header_fields_too_large"


def test_an_oversized_websocket_upgrade_gets_431(quiet_server):
    url = f"ws://127.0.0.1:{quiet_server.settings.port}/v1/ws"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, proxy=None, additional_headers={"X-Filler": "a" * MAX_HEADER_BYTES})
    assert refused.value.response.status_code == 431


def test_headers_that_stop_arriving_get_408_at_the_header_timeout(quiet_server):
    with open_socket(quiet_server) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        error = error_of(read_until_closed(sock), 408)
        elapsed = time.monotonic() - started
    assert error["code"] == "request_timeout"
    assert "--header-timeout" in error["message"]
    assert TIMEOUT_S - 0.1 < elapsed < TIMEOUT_S + 0.5


def test_a_header_block_sent_a_byte_at_a_time_is_cut_at_the_header_timeout(quiet_server):
    with open_socket(quiet_server) as sock:
        started = time.monotonic()
        request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
        for byte in request:
            sock.sendall(bytes([byte]))
            if select.select([sock], [], [], 0.05)[0]:
                break
        error_of(read_until_closed(sock), 408)
        assert time.monotonic() - started < TIMEOUT_S + 0.5


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(quiet_server):
    with open_socket(quiet_server) as sock:
        started = time.monotonic()
        assert read_until_closed(sock) == b""
        assert TIMEOUT_S - 0.1 < time.monotonic() - started < TIMEOUT_S + 0.5


@pytest.mark.parametrize(
    "framing",
    [b'Transfer-Encoding: chunked\r\n\r\n8\r\n{"prompt\r\n', b"Content-Length: 40\r\n\r\n{"],
)
def test_a_body_that_stops_arriving_gets_408_at_the_body_timeout(quiet_server, framing):
    with open_socket(quiet_server) as sock:
        started = time.monotonic()
        sock.sendall(HEAD + framing)
        error = error_of(read_until_closed(sock), 408)
        elapsed = time.monotonic() - started
    assert error["code"] == "request_timeout"
    assert "--body-timeout" in error["message"]
    assert TIMEOUT_S - 0.1 < elapsed < TIMEOUT_S + 0.5


def test_a_body_sent_in_pieces_within_the_body_timeout_is_served(quiet_server):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    with open_socket(quiet_server) as sock:
        sock.sendall(HEAD + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        for start in range(0, len(body), len(body) // 3 + 1):
            time.sleep(TIMEOUT_S / 5)
            sock.sendall(body[start : start + len(body) // 3 + 1])
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ")


def test_a_stream_runs_past_both_timeouts_and_the_connection_stays_usable(quiet_server):
    body = {"prompt": "hi", "max_tokens": 60, "ignore_eos": True, "stream": True}
    url = f"{base_url(quiet_server)}/v1/completions"
    with httpx.Client(timeout=10) as client:
        started = time.monotonic()
        with client.stream("POST", url, json=body) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert time.monotonic() - started > 2 * TIMEOUT_S
        assert lines[-1] == "data: [DONE]"
        last = orjson.loads(lines[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length"
        assert client.get(f"{base_url(quiet_server)}/health").status_code == 200


def test_a_websocket_outlives_the_header_timeout(quiet_server):
    url = f"ws://127.0.0.1:{quiet_server.settings.port}/v1/ws"
    with connect(url, proxy=None, open_timeout=5) as ws:
        time.sleep(2 * TIMEOUT_S)
        frame = {"type": "generate", "id": 1, "prompt": "hi", "max_tokens": 40, "ignore_eos": True}
        ws.send(json.dumps(frame))
        frames = [json.loads(ws.recv(timeout=5))]
        while frames[-1]["type"] == "token":
            frames.append(json.loads(ws.recv(timeout=5)))
    assert frames[-1]["type"] == "done"
    assert frames[-1]["finish_reason"] == "length"


def test_limits_are_flags_with_defaults_and_must_be_positive():
    defaults = server_settings_from(build_parser().parse_args(["serve"]))
    assert (defaults.max_header_bytes, defaults.header_timeout_s, defaults.body_timeout_s) == (
        65536,
        10.0,
        30.0,
    )
    flags = ["serve", "--max-header-bytes", "8192", "--header-timeout", "2", "--body-timeout", "5"]
    settings = server_settings_from(build_parser().parse_args(flags))
    assert (settings.max_header_bytes, settings.header_timeout_s, settings.body_timeout_s) == (
        8192,
        2.0,
        5.0,
    )
    for bad in [
        {"max_header_bytes": 0},
        {"header_timeout_s": 0.0},
        {"header_timeout_s": float("nan")},
        {"body_timeout_s": -1.0},
        {"body_timeout_s": float("inf")},
    ]:
        with pytest.raises(ValueError, match="must be"):
            ServerSettings(**bad)
