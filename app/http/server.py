"""The Starlette application and the uvicorn server around it.

`create_app` wires routes to a `ServerState` (the async engine, the tokenizer, settings);
`serve_front_end` runs it over an engine client (`serve_engine` wraps one loaded engine), the
step thread started inside the app's lifespan, under uvicorn (on asyncio's own event loop, or
uvloop with `--event-loop uvloop`) with the graceful shutdown of app/http/graceful_shutdown.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from baton.app.api.body_fields import MAX_NAME_CHARS
from baton.app.api.embeddings import embeddings
from baton.app.api.openai_api import chat_completions, completions
from baton.app.api.responses_api.responses import responses
from baton.app.api.tokenize import detokenize, tokenize
from baton.app.api.websocket_api import websocket_endpoint
from baton.app.engine.async_engine import AsyncEngine
from baton.app.engine.client import EngineClient
from baton.app.errors import APIError
from baton.app.http.graceful_shutdown import BatonServer
from baton.app.http.http_limits import http_protocol
from baton.app.http.security import security_middleware
from baton.app.http.websocket_protocol import websocket_protocol
from baton.app.observability.prometheus import ServerMetrics, metrics_endpoint
from baton.app.observability.stats_endpoint import WindowSummary, stats_endpoint
from baton.app.request_defaults import NO_REQUEST_DEFAULTS, RequestDefaults
from baton.app.settings import ServerSettings
from baton.app.state import ServerState, json_response, server_metrics, server_state
from baton.core.engine import Engine
from baton.core.kv_cache.host_memory import resident_set
from baton.core.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # OpenTelemetry loads only where tracing is configured: it costs start-up time
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("baton.server")
# The chat UI ships inside the package (package data), so an installed Baton serves it too.
STATIC_DIR = Path(__file__).resolve().parents[2] / "static"


async def health(request: Request) -> Response:
    state = server_state(request)
    if state.engine.healthy:
        return json_response({"status": "ok"})
    return APIError(503, state.engine.failure).response()


def model_card(state: ServerState) -> dict[str, object]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "baton",
        "max_model_len": state.engine.validator.limits.max_model_len,
    }


async def models(request: Request) -> Response:
    return json_response({"object": "list", "data": [model_card(server_state(request))]})


async def model(request: Request) -> Response:
    """`GET /v1/models/{id}`: the served model's card; a hub id's slash is part of the path."""
    state = server_state(request)
    model_id = request.path_params["model_id"]
    if model_id != state.model_name:
        raise APIError(
            404,
            f"the model {model_id[:MAX_NAME_CHARS]!r} does not exist; this server serves "
            f"{state.model_name!r}",
            param="model",
            code="model_not_found",
        )
    return json_response(model_card(state))


async def api_error_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, APIError)
    if error.status == 429:
        server_metrics(request).count_rejection()
    return error.response()


async def http_error_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = str(error.detail)
    path = request.url.path[:MAX_NAME_CHARS]
    if error.status_code == 404:
        message = f"no endpoint {request.method} {path} on this server; check the URL"
    elif error.status_code == 405 and error.headers:
        # The Allow header goes along too: it names the methods the path takes.
        allowed = error.headers.get("Allow", "")
        message = f"{path} does not take {request.method}; send {allowed}"
    return APIError(error.status_code, message, headers=error.headers).response()


async def server_error_handler(request: Request, error: Exception) -> Response:
    logger.exception("unhandled error on %s", request.url.path)
    return APIError(500, "internal server error; the request was not completed").response()


class ChatUIFiles(StaticFiles):
    """The chat UI's files. A path that is none of them is 404 for every method: StaticFiles
    alone answers 405 to any POST, so a client posting to an endpoint Baton lacks would read
    "Method Not Allowed" rather than that there is no such endpoint."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if scope["method"] not in ("GET", "HEAD"):
            # Looked up as a GET first: a missing file raises the 404 here; an existing one
            # goes on to StaticFiles' 405.
            await super().get_response(path, {**scope, "method": "GET"})
        return await super().get_response(path, scope)


def create_app(state: ServerState, span_exporter: SpanExporter | None = None) -> Starlette:
    """The app around `state`. A `span_exporter` (tests) receives each span as it ends,
    besides any exporter the settings name."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.engine.start()
        # Streamed responses run on anyio, whose event-loop backend loads on first use: loaded
        # here, its imports do not hold the GIL while the first request's prefill waits for it.
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
        Route("/v1/models/{model_id:path}", model),
        Route("/v1/stats", stats_endpoint),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        WebSocketRoute("/v1/ws", websocket_endpoint),
    ]
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
    # The chat UI answers what no route matches, after the routes' own 405s for a known path
    # with another method: mounted at "/" it would match every path first and hide those.
    # No trailing-slash redirects: a path that is not an endpoint is a 404.
    app.router.redirect_slashes = False
    if (STATIC_DIR / "index.html").is_file():
        app.router.default = ChatUIFiles(directory=STATIC_DIR, html=True)
    app.state.baton = state
    app.state.metrics = ServerMetrics(
        state.engine,
        state.settings.stats_window_s,
        record=state.settings.record_metrics,
        model_name=state.model_name,
        style=state.settings.metrics_style,
    )
    app.state.window_summary = WindowSummary(app.state.metrics)
    if span_exporter is not None or state.settings.exports_spans:
        from baton.app.observability.telemetry import Tracing, exporters_from

        state.tracing = Tracing(state.engine, state.model_name, exporters_from(state.settings))
        if span_exporter is not None:
            state.tracing.add_exporter(span_exporter, batch=False)
    return app


def uvicorn_config(app: Starlette, settings: ServerSettings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop=settings.event_loop,
        # httptools, plus the header size limit and the header and body timeouts.
        http=http_protocol(settings),
        ws=websocket_protocol(settings),
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
    # delayed acknowledgement (Linux's, 40 ms at the least).
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
    defaults: RequestDefaults = NO_REQUEST_DEFAULTS,
) -> None:
    """Run the server until SIGTERM/SIGINT; blocks. `sock` is the address `bind_socket` took
    (uvicorn binds its own when None)."""
    serve_front_end(
        AsyncEngine(engine, settings.max_queued_requests),
        engine.tokenizer,
        model_name,
        settings,
        sock,
        defaults,
    )


def serve_front_end(
    engine: EngineClient,
    tokenizer: Tokenizer,
    model_name: str,
    settings: ServerSettings,
    sock: socket.socket | None = None,
    defaults: RequestDefaults = NO_REQUEST_DEFAULTS,
) -> None:
    """Run the front end over `engine` (one in-process engine, or replicas behind the same
    interface: app/replicas/replicated_engine.py) until SIGTERM/SIGINT; blocks. `defaults`
    fill what requests leave out (--generation-config, --chat-template)."""
    configure_logging()
    defaults.log()
    state = ServerState(
        engine=engine,
        tokenizer=defaults.tokenizer_for(tokenizer),
        model_name=model_name,
        settings=settings,
        created=int(time.time()),
        sampling_defaults=defaults.sampling,
    )
    app = create_app(state)
    server = BatonServer(uvicorn_config(app, settings), state, exit_on_time=True)
    server.run(sockets=[sock] if sock else None)
