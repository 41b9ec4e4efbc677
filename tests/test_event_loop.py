"""The server's event loop is a flag: asyncio's own by default, uvloop on request; a stream
is served whole on either, and the loop running it is the one named."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import httpx
import pytest
import uvloop

from baton.app.cli import build_parser, server_settings_from
from baton.app.http.server import uvicorn_config
from baton.app.settings import ServerSettings
from tests.server_harness import base_url, running_server, simulated_engine


def test_the_flag_picks_uvicorns_loop():
    default = server_settings_from(build_parser().parse_args(["serve"]))
    assert default.event_loop == "asyncio"
    assert uvicorn_config(None, default).loop == "asyncio"
    chosen = server_settings_from(build_parser().parse_args(["serve", "--event-loop", "uvloop"]))
    assert uvicorn_config(None, chosen).loop == "uvloop"


def test_an_unknown_loop_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="--event-loop must be one of asyncio, uvloop"):
        ServerSettings(event_loop="trio")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--event-loop", "trio"])


@pytest.mark.parametrize(
    ("event_loop", "loop_type"),
    [("asyncio", asyncio.SelectorEventLoop), ("uvloop", uvloop.Loop)],
)
def test_a_stream_is_served_whole_on_either_loop(llama_checkpoint, event_loop, loop_type):
    with running_server(simulated_engine(llama_checkpoint), event_loop=event_loop) as state:
        body = {
            "prompt": "loops",
            "max_tokens": 6,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{base_url(state)}/v1/completions", json=body) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert response.status_code == 200
        assert isinstance(state.engine.loop, loop_type)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 6


def server_side_socket(client: socket.socket) -> socket.socket:
    """The in-process server's end of `client`'s connection (a duplicate of its descriptor)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            candidate = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if candidate.type == socket.SOCK_STREAM and (
                candidate.getpeername() == client.getsockname()
            ):
                return candidate
        except OSError:
            pass
        candidate.close()
    raise AssertionError("no server-side socket for the client's connection")


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_connections_send_small_writes_at_once_on_either_loop(llama_checkpoint, event_loop):
    # asyncio's loop leaves Nagle's algorithm on where the listening socket was not created as
    # IPPROTO_TCP (baton.app.http.server.bind_socket): a response's body then waited ~40 ms for the
    # client's delayed acknowledgement of its head.
    with (
        running_server(simulated_engine(llama_checkpoint), event_loop=event_loop) as state,
        socket.create_connection(("127.0.0.1", state.settings.port)) as client,
    ):
        client.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = client.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head
        with server_side_socket(client) as server_end:
            assert server_end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
