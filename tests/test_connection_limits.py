"""Connections that cannot hold the server: WebSocket upgrade requests that carry a body (or
that the WebSocket library refuses) get 400 and a close, a text frame that is not UTF-8 closes
its socket with 1007 and one log line, and clients that stop reading (pings never answered,
token frames or SSE chunks never taken) are held to --send-buffer-bytes, then dropped after
--send-timeout with their requests aborted while other clients are served."""

from __future__ import annotations

import json
import logging
import select
import socket
import struct
import time

import httpx
import orjson
import pytest

from tests.server_harness import base_url, running_server, simulated_engine

SEND_BUFFER_BYTES = 16 * 1024
SEND_TIMEOUT_S = 1.0
HANDSHAKE = (
    b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
PING = 0x9
TEXT = 0x1


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint, max_model_len=8192)
    limits = {"send_buffer_bytes": SEND_BUFFER_BYTES, "send_timeout_s": SEND_TIMEOUT_S}
    with running_server(engine, header_timeout_s=1.0, body_timeout_s=1.0, **limits) as state:
        yield state


@pytest.fixture
def quiet_server(server, caplog, capfd):
    """The server, and after the test a check that nothing logged an error or a traceback:
    a dropped client is a warning, not a failure."""
    yield server
    time.sleep(0.1)
    assert "Traceback" not in capfd.readouterr().err
    records = caplog.get_records("call") + caplog.get_records("teardown")
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []


def connect(state, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:
        # Set before connecting, so the window the client offers stays this small.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", state.settings.port))
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def frame(opcode: int, payload: bytes) -> bytes:
    """A client frame (masked, with an all-zero key so the payload stays as it is)."""
    if len(payload) < 126:
        head = bytes([0x80 | opcode, 0x80 | len(payload)])
    else:
        head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack("!H", len(payload))
    return head + b"\0\0\0\0" + payload


def open_websocket(state, receive_buffer: int | None = None) -> socket.socket:
    sock = connect(state, receive_buffer)
    sock.sendall(HANDSHAKE + b"\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 101 "), answer
    return sock


def shrink_send_buffer(state) -> None:
    """Keep the kernel from taking megabytes off the server's buffer for a client that does
    not read: the bound under test is the server's own."""
    assert wait_until(lambda: len(state.server.server_state.connections) == 1, 5)
    for connection in state.server.server_state.connections:
        sock = connection.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


def unsent_bytes(state) -> int:
    return sum(c.transport.get_write_buffer_size() for c in state.server.server_state.connections)


def writing_paused(state) -> bool:
    """Whether a connection's send buffer went past the limit and has not drained since."""
    return any(
        not c.writable.is_set() if hasattr(c, "writable") else c.flow.write_paused
        for c in state.server.server_state.connections
    )


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 5\r\n\r\nhello",
        b"Content-Length: 4000\r\n\r\nhello",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
)
@pytest.mark.parametrize("path", [b"/v1/ws", b"/health", b"/no-such-path"])
def test_an_upgrade_request_with_a_body_gets_400_and_a_close(server, framing, path):
    with connect(server) as sock:
        sock.sendall(HANDSHAKE.replace(b"/v1/ws", path) + framing)
        started = time.monotonic()
        answer = read_until_closed(sock)
    # At once: well before the header and body timeouts would close it.
    assert time.monotonic() - started < 0.9
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    error = orjson.loads(body)["error"]
    assert error["code"] == "invalid_upgrade"
    assert "must not carry a body" in error["message"] and "Content-Length" in error["message"]


def test_an_upgrade_the_websocket_library_refuses_gets_400(server):
    # A header line longer than the WebSocket library reads, though within --max-header-bytes.
    with connect(server) as sock:
        sock.sendall(HANDSHAKE + b"X-Long: " + b"a" * 10_000 + b"\r\n\r\n")
        answer = read_until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    error = orjson.loads(body)["error"]
    assert error["code"] == "invalid_upgrade"
    assert "WebSocket upgrade request is malformed" in error["message"]
    # A body of length 0 is no body: the upgrade goes through.
    with connect(server) as sock:
        sock.sendall(HANDSHAKE + b"Content-Length: 0\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 101 ")


def test_a_text_frame_that_is_not_utf8_closes_with_1007_and_one_log_line(server, caplog, capfd):
    caplog.set_level(logging.INFO)
    payload = b'{"type": "generate", "prompt": "caf\xe9"}'
    with open_websocket(server) as sock:
        sock.sendall(frame(TEXT, payload))
        answer = read_until_closed(sock)
    # One close frame, code 1007.
    assert answer[0] == 0x88 and struct.unpack("!H", answer[2:4]) == (1007,)
    time.sleep(0.1)
    assert "Traceback" not in capfd.readouterr().err
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in lines] == [
        f"closed a WebSocket with 1007: a text frame is not UTF-8 (byte {payload.index(0xE9)})"
    ]


def test_pings_from_a_client_that_never_reads_queue_no_more_than_the_limit(quiet_server):
    ping = frame(PING, b"p" * 125)
    with open_websocket(quiet_server, receive_buffer=4096) as sock:
        sock.setblocking(False)
        sent = 0
        # The quiet_server stops reading once its pongs fill the buffer, so sends stall; without
        # that it reads and queues pongs as fast as they come.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and sent < 64 * 2**20:
            if not select.select([], [sock], [], 0.5)[1]:
                break
            try:
                sent += sock.send(ping * 512)
            except BlockingIOError:
                continue
        # The pongs of one read (at most 256 KiB) past the limit, no more.
        assert unsent_bytes(quiet_server) <= SEND_BUFFER_BYTES + 256 * 1024
        # Then dropped: the quiet_server forgets the connection and resets it.
        assert wait_until(
            lambda: not quiet_server.server.server_state.connections, 5 * SEND_TIMEOUT_S
        )
    assert sent > 0


def test_a_websocket_that_never_reads_its_tokens_is_dropped_and_its_request_aborted(quiet_server):
    engine = quiet_server.engine
    with open_websocket(quiet_server, receive_buffer=4096) as sock:
        shrink_send_buffer(quiet_server)
        request = {"type": "generate", "id": 1, "prompt": "hi", "max_tokens": 8000}
        sock.sendall(frame(TEXT, json.dumps({**request, "ignore_eos": True}).encode()))
        assert wait_until(lambda: engine.num_in_flight == 1, 5)
        assert wait_until(lambda: writing_paused(quiet_server), 10)
        # Paused, not failed: the producer waits while another client is served in full.
        body = {"prompt": "hello", "max_tokens": 5, "ignore_eos": True}
        reply = httpx.post(f"{base_url(quiet_server)}/v1/completions", json=body, timeout=10)
        assert reply.json()["usage"]["completion_tokens"] == 5
        # Dropped after --send-timeout: its request is aborted and its stream released.
        assert wait_until(lambda: engine.num_in_flight == 0, 10 * SEND_TIMEOUT_S)
        assert unsent_bytes(quiet_server) == 0


def test_an_sse_stream_that_is_never_read_is_dropped_and_its_request_aborted(quiet_server):
    engine = quiet_server.engine
    body = json.dumps({"prompt": "hi", "max_tokens": 8000, "ignore_eos": True, "stream": True})
    with connect(quiet_server, receive_buffer=4096) as sock:
        shrink_send_buffer(quiet_server)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body.encode())
        )
        assert wait_until(lambda: engine.num_in_flight == 1, 5)
        assert wait_until(lambda: writing_paused(quiet_server), 10)
        assert wait_until(lambda: engine.num_in_flight == 0, 10 * SEND_TIMEOUT_S)
        assert unsent_bytes(quiet_server) == 0


def test_a_slow_reader_of_a_large_answer_is_not_dropped(quiet_server):
    # About 250 KB of JSON, written whole once the 16 choices end.
    body = json.dumps({"prompt": "hi", "max_tokens": 3000, "ignore_eos": True, "n": 16})
    with connect(quiet_server, receive_buffer=4096) as sock:
        shrink_send_buffer(quiet_server)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body.encode())
        )
        # One write of the whole answer, taken a little at a time for several --send-timeouts:
        # the buffer stays past the limit throughout, but the client keeps reading.
        answer = b""
        started = time.monotonic()
        while chunk := sock.recv(16 * 1024):
            answer += chunk
            time.sleep(0.1)
    assert time.monotonic() - started > 2 * SEND_TIMEOUT_S
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert orjson.loads(payload)["usage"]["completion_tokens"] == 16 * 3000
