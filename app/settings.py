"""Server settings: what `baton serve` flags set beyond the engine's own configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from baton.core.request import SLO
from baton.core.sampling_params import InvalidRequestError

# What `/metrics` names its series after (baton.app.observability.prometheus).
METRICS_STYLES = ("baton", "vllm", "both")
EVENT_LOOPS = ("asyncio", "uvloop")


@dataclass(slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_keys: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    # Host names answered beyond loopback's own when bound to loopback (baton.app.http.security).
    allowed_hosts: list[str] = field(default_factory=list)
    max_queued_requests: int = 256
    # Bodies past this get 413 before they are read whole.
    max_body_bytes: int = 4 * 1024 * 1024
    shutdown_timeout_s: float = 30.0
    # The request target and header fields past this get 431 (baton.app.http.http_limits).
    max_header_bytes: int = 64 * 1024
    # A request whose headers, or whose body, take longer than this to arrive gets 408.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    otlp_traces_endpoint: str | None = None
    # Print every span to stdout: for debugging, not production.
    trace_console: bool = False
    # The sliding window /v1/stats reports over.
    stats_window_s: float = 60.0
    # Off only to measure what metrics cost (benchmarks/server_throughput.py): the engine's
    # step and finish listeners are then not attached and the aggregates stay at zero.
    record_metrics: bool = True
    # The format `tool_choice: auto` parses calls in (baton.app.api.tool_parsers); None: read it off
    # the chat template.
    tool_call_parser: str | None = None
    # Names on /metrics: Baton's (`baton:`), vLLM's (`vllm:`, for its dashboards), or both.
    metrics_style: str = "baton"
    # The event loop uvicorn runs on. asyncio's own lets the step thread run while a socket
    # write is in the kernel: uvloop holds the GIL through each write, and the step thread
    # waits for it every token, which lengthens a lone stream's TPOT (docs/decisions.md).
    event_loop: str = "asyncio"

    @property
    def exports_spans(self) -> bool:
        """Whether a flag asks for request traces (baton.app.observability.telemetry exports
        them)."""
        return bool(self.otlp_traces_endpoint) or self.trace_console

    def __post_init__(self) -> None:
        try:
            SLO(self.ttft_slo_ms, self.tpot_slo_ms)  # the server's defaults obey a request's bounds
        except InvalidRequestError as error:
            flag = "--ttft-slo-ms" if "ttft" in str(error) else "--tpot-slo-ms"
            raise ValueError(f"{flag}: {error}") from None
        if self.metrics_style not in METRICS_STYLES:
            raise ValueError(
                f"--metrics-style must be one of {', '.join(METRICS_STYLES)}, "
                f"got {self.metrics_style!r}"
            )
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(
                f"--event-loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}"
            )
        if self.max_queued_requests < 0:
            raise ValueError(f"--max-queued-requests must be >= 0, got {self.max_queued_requests}")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout_s}")
        if self.max_header_bytes < 1:
            raise ValueError(f"--max-header-bytes must be >= 1, got {self.max_header_bytes}")
        for flag, seconds in [
            ("--header-timeout", self.header_timeout_s),
            ("--body-timeout", self.body_timeout_s),
        ]:
            if not 0 < seconds < math.inf:
                raise ValueError(f"{flag} must be a positive number of seconds, got {seconds}")
        if any(not key for key in self.api_keys):
            raise ValueError("--api-key must not be empty")
