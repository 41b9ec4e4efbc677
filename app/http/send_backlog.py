"""A connection's unsent bytes, bounded: past `--send-buffer-bytes` the transport pauses its
protocol (the stream or socket stops producing, and a WebSocket stops reading frames, pings
included), and a client that takes none of them for `--send-timeout` seconds is dropped, which
ends its streams and so aborts their requests. A slow client that keeps reading is not."""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger("baton.connections")


class SendBacklog:
    """One connection's send buffer: its limit, and the timer that runs while it is full."""

    def __init__(self, transport: asyncio.Transport, limit_bytes: int, timeout_s: float) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        # The transport calls pause_writing past `high` and resume_writing below a quarter of it.
        transport.set_write_buffer_limits(high=limit_bytes)
        self._timer: asyncio.TimerHandle | None = None
        # The unsent bytes when the timer was last armed: fewer later means the client reads.
        self._unsent = 0

    def paused(self) -> None:
        if self._timer is None:
            self._arm()

    def resumed(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._unsent = self.transport.get_write_buffer_size()
        self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expired)

    def _expired(self) -> None:
        if self.transport.get_write_buffer_size() < self._unsent:
            self._arm()
        else:
            self._drop()

    def _drop(self) -> None:
        self._timer = None
        peer = self.transport.get_extra_info("peername")
        logger.warning(
            "dropped the connection from %s: it read nothing of %d unsent bytes for %g s "
            "(--send-timeout)",
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client",
            self.transport.get_write_buffer_size(),
            self.timeout_s,
        )
        # Closing would wait for the client to take what is queued; it never will.
        self.transport.abort()
