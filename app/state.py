"""What every route reaches: the server's shared state, set on the app at start-up, and typed
accessors for it and for the metrics."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from starlette.requests import HTTPConnection
from starlette.responses import Response

from baton.app.api.reasoning import ReasoningParser, reasoning_parser
from baton.app.engine.client import EngineClient
from baton.app.observability.prometheus import ServerMetrics
from baton.app.settings import ServerSettings
from baton.core.checkpoint.generation_config import NO_DEFAULTS, SamplingDefaults
from baton.core.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # OpenTelemetry loads only where tracing is configured (baton.app.http.server)
    from baton.app.observability.telemetry import Tracing


@dataclass
class ServerState:
    """Everything a route needs; `server_state(request)` returns it."""

    engine: EngineClient
    tokenizer: Tokenizer
    model_name: str
    settings: ServerSettings
    created: int = 0
    # What a request's omitted sampling fields become (--generation-config); none by default.
    sampling_defaults: SamplingDefaults = NO_DEFAULTS
    # Set when spans are exported (--otlp-traces-endpoint, --trace-console or a test's exporter).
    tracing: Tracing | None = None
    # --reasoning-parser, checked against the tokenizer when the server starts.
    reasoning_parser: ReasoningParser | None = field(init=False)
    # Requests still in admission (tokenizing, compiling), which the engine does not count yet;
    # `stopping` is set when a graceful shutdown gives up on them
    # (baton.app.http.graceful_shutdown).
    admitting: int = field(default=0, init=False)
    stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.reasoning_parser = reasoning_parser(self.settings.reasoning_parser, self.tokenizer)

    def next_request_id(self, prefix: str) -> str:
        """`prefix-` and 32 random hex digits, as vLLM's ids: unique across restarts and
        replicas, and no count of the requests served shows through."""
        return f"{prefix}-{uuid.uuid4().hex}"


def server_state(connection: HTTPConnection) -> ServerState:
    """The state of the app serving `connection` (a request or a WebSocket)."""
    return connection.app.state.baton


def server_metrics(connection: HTTPConnection) -> ServerMetrics:
    return connection.app.state.metrics


def json_response(body: object, status: int = 200, headers: dict | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )
