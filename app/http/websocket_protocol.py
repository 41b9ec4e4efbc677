"""uvicorn's WebSocket protocol with a bounded send buffer and clean closes: while the client
does not take what is sent, frames are no longer read (so pings queue no pongs) and senders
wait; after `--send-timeout` the connection is dropped (app/http/send_backlog.py). A text frame
that is not UTF-8 closes the socket with 1007 and one log line. `websocket_protocol(settings)`
is the class for uvicorn's `ws=`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn._types import ASGIReceiveEvent
from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from baton.app.http.send_backlog import SendBacklog
from baton.app.settings import ServerSettings

logger = logging.getLogger("baton.websocket")
INVALID_UTF8 = 1007


def websocket_protocol(settings: ServerSettings) -> type[BoundedWebSocketProtocol]:
    """The protocol class for uvicorn's `ws=`, holding `settings`' limits."""
    limits = {
        "send_buffer_bytes": settings.send_buffer_bytes,
        "send_timeout_s": settings.send_timeout_s,
    }
    return type("BoundedWebSocketProtocol", (BoundedWebSocketProtocol,), limits)


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    """Build it with `websocket_protocol`."""

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
        self.backlog: SendBacklog | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.backlog = SendBacklog(self.transport, self.send_buffer_bytes, self.send_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.backlog is not None:
            self.backlog.resumed()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        # Every frame read could queue a reply (a ping its pong) behind what the client
        # does not take: nothing more is read until it does.
        self.transport.pause_reading()
        if self.backlog is not None:
            self.backlog.paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.backlog is not None:
            self.backlog.resumed()
        if not self.read_paused:
            self.transport.resume_reading()

    async def receive(self) -> ASGIReceiveEvent:
        message = await self.queue.get()
        # uvicorn's, except that reading stays paused while the send buffer is full.
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            if self.writable.is_set():
                self.transport.resume_reading()
        return message

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError as error:
                self.frames = []
                logger.warning(
                    "closed a WebSocket with %d: a text frame is not UTF-8 (byte %d)",
                    INVALID_UTF8,
                    error.start,
                )
                self.conn.send_close(INVALID_UTF8, "text frames must be UTF-8")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()
