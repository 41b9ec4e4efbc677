"""Limits uvicorn's HTTP/1.1 protocol lacks, so unfinished requests cannot hold connections: the
header block's size (`--max-header-bytes`), how long headers and body may take to arrive
(`--header-timeout`, `--body-timeout`), how much a response may hold unsent
(`--send-buffer-bytes`, `--send-timeout`), and no WebSocket upgrade that carries a body or a
handshake the WebSocket library refuses. `http_protocol(settings)` is the class for uvicorn's
`http=`; docs/architecture.md (Serving, Security) says what each limit answers.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

from starlette.responses import Response
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from baton.app.errors import APIError
from baton.app.http.send_backlog import SendBacklog
from baton.app.settings import ServerSettings

# The ": " and CRLF around each header field's name and value.
HEADER_LINE_OVERHEAD = 4


def http_protocol(settings: ServerSettings) -> type[LimitedHttpProtocol]:
    """The protocol class for uvicorn's `http=`, holding `settings`' limits."""
    limits = {
        "max_header_bytes": settings.max_header_bytes,
        "header_timeout_s": settings.header_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "send_buffer_bytes": settings.send_buffer_bytes,
        "send_timeout_s": settings.send_timeout_s,
    }
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), limits)


def refusal(status: int, message: str, code: str) -> Response:
    """An OpenAI-shaped error that also ends the connection."""
    return APIError(status, message, code=code, headers={"Connection": "close"}).response()


def wire_bytes(response: Response) -> bytes:
    """`response` as HTTP/1.1 bytes, for answers written outside any request cycle."""
    status = HTTPStatus(response.status_code)
    lines = [f"HTTP/1.1 {status.value} {status.phrase}".encode("latin-1")]
    lines += [name + b": " + value for name, value in response.raw_headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + response.body


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; build it with `http_protocol`."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    send_buffer_bytes: int
    send_timeout_s: float

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # The target and header fields of the request being read, as the parser reports them.
        self._head_bytes = 0
        # Bytes of the chunks that arrived wholly inside that request's header block.
        self._head_bytes_received = 0
        self._requests_begun = 0
        self._backlog: SendBacklog | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._backlog = SendBacklog(transport, self.send_buffer_bytes, self.send_timeout_s)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._backlog is not None:
            self._backlog.paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._backlog is not None:
            self._backlog.resumed()

    def data_received(self, data: bytes) -> None:
        begun = self._requests_begun
        super().data_received(data)
        # The parser holds an unfinished header inside itself: count the raw bytes instead.
        if self._head_timer is not None and self._requests_begun == begun:
            self._head_bytes_received += len(data)
            if self._head_bytes_received > self.max_header_bytes:
                self._close(self._header_too_large() if self._between_responses() else None)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._requests_begun += 1
        self._head_bytes = 0
        self._head_bytes_received = 0
        # Begun since the connection opened: that timer runs on, so a first byte buys no time.
        if self._head_timer is None:
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head_bytes += len(name) + len(value) + HEADER_LINE_OVERHEAD

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        if self._head_bytes > self.max_header_bytes:
            # The app never sees the request; the refusal is this connection's last answer.
            self.app = self._header_too_large()
        super().on_headers_complete()
        self._start_body_timer()

    def on_message_complete(self) -> None:
        self._cancel_body_timer()
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._stop_timers()
        if self._head_bytes > self.max_header_bytes:
            self._close(self._header_too_large() if self._between_responses() else None)
            return
        if self._has_body():
            # The handshake's body would be read by nobody and its timeout never run.
            self._close(
                refusal(
                    400,
                    "a WebSocket upgrade request must not carry a body; send it without "
                    "Content-Length or Transfer-Encoding",
                    "invalid_upgrade",
                )
            )
            return
        super().handle_websocket_upgrade()
        handshake = getattr(self.transport.get_protocol(), "conn", None)
        failure = getattr(handshake, "handshake_exc", None)
        if failure is not None and not self.transport.is_closing():
            # The WebSocket library refused the handshake but answers nothing on its own.
            reason = failure.__cause__ or failure
            self._close(
                refusal(
                    400,
                    f"the WebSocket upgrade request is malformed ({reason}); send a plain "
                    "RFC 6455 handshake",
                    "invalid_upgrade",
                )
            )

    def _has_body(self) -> bool:
        lengths = {value.strip() for name, value in self.headers if name == b"content-length"}
        framed = any(name == b"transfer-encoding" for name, _ in self.headers)
        return framed or not lengths <= {b"0"}

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _start_body_timer(self) -> None:
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.flow.read_paused:
            self._start_head_timer()
        elif self._requests_begun and self._between_responses():
            self._close(self._timed_out("headers", self.header_timeout_s, "--header-timeout"))
        else:
            # Nothing asked yet (an idle connection), or an answer is being written: no 408.
            self._close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.flow.read_paused:
            self._start_body_timer()
        elif self.cycle is None or self.cycle.response_started:
            # An answer has begun, or none can be given (an upgrade left half-done).
            self._close()
        else:
            self._close(self._timed_out("body", self.body_timeout_s, "--body-timeout"))

    def _between_responses(self) -> bool:
        """Whether no response is being written, so an answer cannot cut into one."""
        return self.cycle is None or self.cycle.response_complete

    def _close(self, answer: Response | None = None) -> None:
        """Close the connection, after writing `answer` when there is one."""
        if answer is not None and not self.transport.is_closing():
            self.transport.write(wire_bytes(answer))
        self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _stop_timers(self) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        # After an upgrade the WebSocket protocol watches the send buffer.
        if self._backlog is not None:
            self._backlog.resumed()

    def _header_too_large(self) -> Response:
        return refusal(
            431,
            f"the request line and headers are larger than the server's limit of "
            f"{self.max_header_bytes} bytes; send fewer or shorter headers "
            f"(the limit is --max-header-bytes)",
            "request_header_fields_too_large",
        )

    @staticmethod
    def _timed_out(part: str, seconds: float, flag: str) -> Response:
        return refusal(
            408,
            f"the request's {part} did not arrive within {seconds:g} s; send the whole request "
            f"without pausing (the limit is {flag})",
            "request_timeout",
        )
