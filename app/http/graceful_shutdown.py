"""The graceful shutdown around uvicorn: how `--shutdown-timeout` is shared between the streams
in flight, the final frames of those aborted and uvicorn's own close, and `BatonServer`, the
uvicorn server that keeps to it."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from baton.app.http.exit_deadline import ExitDeadline
from baton.app.state import ServerState

logger = logging.getLogger("baton.server")
# The end of --shutdown-timeout: the last quarter, up to CLOSE_GRACE_S, for uvicorn's own
# shutdown (closing connections, the lifespan); the tenth before it, up to FINAL_FRAMES_GRACE_S,
# for the final chunks and done frames of the requests aborted then.
CLOSE_GRACE_S = 0.5
FINAL_FRAMES_GRACE_S = 2.0
# uvicorn's graceful wait with no time left cancels even an idle server's tasks: the least it gets.
MIN_CLOSE_S = 0.1


def close_grace_s(shutdown_timeout_s: float) -> float:
    """The end of the shutdown timeout kept for uvicorn's own shutdown."""
    return min(CLOSE_GRACE_S, shutdown_timeout_s / 4)


def drain_s(shutdown_timeout_s: float) -> float:
    """How long in-flight requests may run on after shutdown begins before they are aborted:
    the timeout less its ends for the aborted requests' final frames and uvicorn's shutdown."""
    final_frames_s = min(FINAL_FRAMES_GRACE_S, shutdown_timeout_s / 10)
    return shutdown_timeout_s - close_grace_s(shutdown_timeout_s) - final_frames_s


class BatonServer(uvicorn.Server):
    """uvicorn, plus Baton's graceful shutdown: on SIGTERM/SIGINT new connections are refused
    at once, running streams get most of `shutdown_timeout_s` to finish, then the engine aborts
    the rest so every stream still ends with a final chunk and a finish reason. Clients that
    stopped reading are cut off, and the whole shutdown ends within the timeout.

    With `exit_on_time` (`baton serve`, not a server inside a test) the process also ends at the
    timeout whatever still runs (app/http/exit_deadline.py)."""

    def __init__(
        self, config: uvicorn.Config, state: ServerState, *, exit_on_time: bool = False
    ) -> None:
        super().__init__(config)
        self.state = state
        timeout_s = state.settings.shutdown_timeout_s
        self._exit_deadline = ExitDeadline(timeout_s) if exit_on_time else None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn would record the signal and raise it again after shutting down, so the
        # process ended killed by SIGTERM (status 143); a graceful stop is a clean exit (0).
        # Only flags are set here: this runs as a signal handler, in the middle of the loop.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
        if self._exit_deadline is not None:
            self._exit_deadline.signalled()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn would close WebSockets at once (1012); streams of both kinds get the grace
        # period first, so this drains before handing over to uvicorn's own shutdown.
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        engine = self.state.engine
        engine.drain()
        loop = asyncio.get_running_loop()
        timeout_s = self.state.settings.shutdown_timeout_s
        began = loop.time()
        deadline = began + timeout_s
        close_s = close_grace_s(timeout_s)
        abort_at = began + drain_s(timeout_s)
        logger.info("shutting down: in-flight requests have %.1f s to finish", abort_at - began)
        await self._wait_idle(abort_at)
        if self._busy():
            # Aborted requests still end with a final chunk or done frame with a reason; those
            # still in admission get a 503.
            engine.abort_all()
            self.state.stopping.set()
            await self._wait_idle(deadline - close_s)
        await self._drop_stalled_connections()
        # uvicorn's own shutdown gets what is left of the timeout, not a fixed wait on top.
        self.config.timeout_graceful_shutdown = max(deadline - loop.time(), MIN_CLOSE_S)
        await super().shutdown(sockets)

    async def _wait_idle(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while self._busy() and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)

    def _busy(self) -> bool:
        """Requests in the engine, or still in admission, which the engine does not count."""
        return bool(self.state.engine.num_in_flight or self.state.admitting)

    async def _drop_stalled_connections(self) -> None:
        """Abort the connections whose client has stopped reading. Closing one would wait for
        the client to take what is queued, so its stream would hang until uvicorn cancelled it."""
        stalled = [
            connection.transport
            for connection in self.server_state.connections
            if connection.transport.get_write_buffer_size()
        ]
        for transport in stalled:
            transport.abort()
        if stalled:
            # The hang-ups reach the streams on the loop's next turn, before uvicorn looks.
            await asyncio.sleep(0)
