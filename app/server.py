"""The Starlette application and the uvicorn server around it.

`create_app` wires routes to a `ServerState` (the async engine, the tokenizer, settings);
`serve` loads a checkpoint, starts the step thread inside the app's lifespan and runs uvicorn
(on asyncio's own event loop, or uvloop with `--event-loop uvloop`), with a graceful shutdown
that lets streams finish before aborting them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from app.async_engine import AsyncEngine
from app.errors import APIError
from app.http_limits import http_protocol
from app.openai_api import chat_completions, completions
from app.prometheus import ServerMetrics, metrics_endpoint
from app.security import security_middleware
from app.settings import ServerSettings
from app.state import ServerState, json_response, server_metrics, server_state
from app.stats_endpoint import stats_endpoint
from app.websocket_api import websocket_endpoint
from core.engine import Engine
from core.host_memory import resident_set
from core.tokenizer import Tokenizer

if TYPE_CHECKING:  # OpenTelemetry loads only where tracing is configured: it costs start-up time
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("baton.server")
# The end of --shutdown-timeout: the last quarter, up to CLOSE_GRACE_S, for uvicorn's own
# shutdown (closing connections, the lifespan); the tenth before it, up to FINAL_FRAMES_GRACE_S,
# for the final chunks and done frames of the requests aborted then.
CLOSE_GRACE_S = 0.5
FINAL_FRAMES_GRACE_S = 2.0
# uvicorn's graceful wait with no time left cancels even an idle server's tasks: the least it gets.
MIN_CLOSE_S = 0.1
# The chat UI ships inside the package (package data), so an installed Baton serves it too.
STATIC_DIR = Path(__file__).resolve().parent / "static"


async def health(request: Request) -> Response:
    state = server_state(request)
    if state.engine.healthy:
        return json_response({"status": "ok"})
    return APIError(503, state.engine.failure).response()


async def models(request: Request) -> Response:
    state = server_state(request)
    card = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "baton",
        "max_model_len": state.engine.max_model_len,
    }
    return json_response({"object": "list", "data": [card]})


async def api_error_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, APIError)
    if error.status == 429:
        server_metrics(request).count_rejection()
    return error.response()


async def http_error_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = error.detail if error.status_code != 404 else f"no route {request.url.path}"
    return APIError(error.status_code, str(message)).response()


async def server_error_handler(request: Request, error: Exception) -> Response:
    logger.exception("unhandled error on %s", request.url.path)
    return APIError(500, "internal server error; the request was not completed").response()


def create_app(state: ServerState, span_exporter: SpanExporter | None = None) -> Starlette:
    """The app around `state`. A `span_exporter` (tests) receives each span as it ends,
    besides any exporter the settings name."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.engine.start()
        # Streamed responses run on anyio, whose event-loop backend loads on first use: ~20 ms
        # of imports that would otherwise run on the event loop while the first request's
        # prefill waits for the GIL (its TTFT was twice the next ones').
        await anyio.sleep(0)
        settings = state.settings
        print(
            f"Baton is serving {state.model_name} at http://{settings.host}:{settings.port} "
            f"(chat UI at /, OpenAI API at /v1)",
            flush=True,
        )
        try:
            yield
        finally:
            await asyncio.to_thread(state.engine.stop, 10.0)
            if state.tracing is not None:
                await asyncio.to_thread(state.tracing.shutdown)
            logger.info("stopped: %s", resident_set().describe())

    routes = [
        Route("/health", health),
        Route("/metrics", metrics_endpoint),
        Route("/v1/models", models),
        Route("/v1/stats", stats_endpoint),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        WebSocketRoute("/v1/ws", websocket_endpoint),
    ]
    if (STATIC_DIR / "index.html").is_file():
        routes.append(Mount("/", StaticFiles(directory=STATIC_DIR, html=True)))
    app = Starlette(
        routes=routes,
        middleware=security_middleware(state.settings),
        exception_handlers={
            APIError: api_error_handler,
            HTTPException: http_error_handler,
            Exception: server_error_handler,
        },
        lifespan=lifespan,
    )
    app.state.baton = state
    app.state.metrics = ServerMetrics(
        state.engine,
        state.settings.stats_window_s,
        record=state.settings.record_metrics,
        model_name=state.model_name,
        style=state.settings.metrics_style,
    )
    if span_exporter is not None or state.settings.exports_spans:
        from app.telemetry import Tracing, exporters_from

        state.tracing = Tracing(state.engine, state.model_name, exporters_from(state.settings))
        if span_exporter is not None:
            state.tracing.add_exporter(span_exporter, batch=False)
    return app


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
    stopped reading are cut off, and the whole shutdown ends within the timeout."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn would record the signal and raise it again after shutting down, so the
        # process ended killed by SIGTERM (status 143); a graceful stop is a clean exit (0).
        # Only flags are set here: this runs as a signal handler, in the middle of the loop.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn would close WebSockets at once (1012); streams of both kinds get the grace
        # period first, so this drains before handing over to uvicorn's own shutdown.
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        engine = self.state.engine
        engine.draining = True
        loop = asyncio.get_running_loop()
        timeout_s = self.state.settings.shutdown_timeout_s
        began = loop.time()
        deadline = began + timeout_s
        close_s = close_grace_s(timeout_s)
        abort_at = began + drain_s(timeout_s)
        logger.info("shutting down: in-flight requests have %.1f s to finish", abort_at - began)
        await self._wait_idle(abort_at)
        if engine.num_in_flight:
            # Aborted requests still end with a final chunk or done frame with a reason.
            engine.abort_all()
            await self._wait_idle(deadline - close_s)
        await self._drop_stalled_connections()
        # uvicorn's own shutdown gets what is left of the timeout, not a fixed wait on top.
        self.config.timeout_graceful_shutdown = max(deadline - loop.time(), MIN_CLOSE_S)
        await super().shutdown(sockets)

    async def _wait_idle(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while self.state.engine.num_in_flight and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)

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


def uvicorn_config(app: Starlette, settings: ServerSettings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop=settings.event_loop,
        # httptools, plus the header size limit and the header and body timeouts.
        http=http_protocol(settings),
        ws="websockets-sansio",
        log_level="warning",
        access_log=False,
        # A WebSocket frame carries a request as a POST body does: the same limit applies.
        ws_max_size=settings.max_body_bytes,
        # Token frames are a few dozen bytes: compressing each costs more CPU than it saves.
        ws_per_message_deflate=False,
    )


def configure_logging() -> None:
    """Info level for Baton's own lines: the startup summary (the model's path, the KV cache)
    and one line per finished request (baton.requests), no more. Set before the model loads,
    so the loader's lines show too."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def bind_socket(settings: ServerSettings) -> socket.socket:
    """The server's listening address, taken before the model loads: a busy port fails in a
    moment with a clear message instead of after a long load. uvicorn serves on this socket."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # Named IPPROTO_TCP, not left 0: asyncio's loop turns Nagle's algorithm off only on
    # connections whose socket says so (uvloop on every TCP one). With it on, a response's
    # second small write (a body after its head, a stream's next token) waited for the client's
    # delayed acknowledgement, ~40 ms (docs/benchmarks.md, "Issue 20, sixteenth round").
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # As uvicorn does: a restart may take the port while the last run's connections time out.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as error:
        sock.close()
        raise AddressUnavailable(
            f"cannot listen on {settings.host}:{settings.port}: {error.strerror or error}; "
            "is another server running there? Stop it or pick another --port"
        ) from None
    return sock


class AddressUnavailable(ValueError):
    """--host/--port cannot be bound (in use, or not an address of this machine)."""


def log_startup(engine: Engine, model: str, load_s: float) -> None:
    """One line saying what was loaded where, how much KV cache it got and the memory the
    process holds (its resident set, which is what the operating system counts against it)."""
    executor = engine.executor
    blocks = executor.num_kv_blocks
    model_config = getattr(executor, "model_config", None)
    logger.info(
        "loaded %s (%s on the %s path) in %.1f s: device %s, dtype %s, quantization %s, "
        "KV cache %d blocks x %d tokens = %d tokens, max model len %d, %s",
        model,
        model_config.architecture if model_config else "simulated",
        model_config.model_impl if model_config else "simulated",
        load_s,
        getattr(executor, "device", "simulated"),
        str(getattr(executor, "dtype", "none")).removeprefix("torch."),
        getattr(executor, "quantization", "none"),
        blocks,
        executor.block_size,
        blocks * executor.block_size,
        engine.max_model_len,
        resident_set().describe(),
    )


def serve_engine(
    engine: Engine,
    model_name: str,
    settings: ServerSettings,
    sock: socket.socket | None = None,
) -> None:
    """Run the server until SIGTERM/SIGINT; blocks. `sock` is the address `bind_socket` took
    (uvicorn binds its own when None)."""
    serve_front_end(
        AsyncEngine(engine, settings.max_queued_requests),
        engine.tokenizer,
        model_name,
        settings,
        sock,
    )


def serve_front_end(
    engine: AsyncEngine,
    tokenizer: Tokenizer,
    model_name: str,
    settings: ServerSettings,
    sock: socket.socket | None = None,
) -> None:
    """Run the front end over `engine` (one in-process engine, or replicas behind the same
    interface: app/replicated_engine.py) until SIGTERM/SIGINT; blocks."""
    configure_logging()
    state = ServerState(
        engine=engine,
        tokenizer=tokenizer,
        model_name=model_name,
        settings=settings,
        created=int(time.time()),
    )
    app = create_app(state)
    BatonServer(uvicorn_config(app, settings), state).run(sockets=[sock] if sock else None)
