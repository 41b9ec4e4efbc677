"""The server's settings: what `baton serve` flags set beyond the model (app/model_settings.py)
and the engine's own configuration; each field is also its flag."""

from __future__ import annotations

import math
from dataclasses import dataclass

from baton.app.api.reasoning import REASONING_PARSERS
from baton.app.api.tools.tool_parsers import PARSERS
from baton.core.pooling import Pooling
from baton.core.request import SLO
from baton.core.request_bounds import RequestBounds
from baton.core.sampling_params import InvalidRequestError
from baton.core.setting import comma_list, setting

# What `/metrics` names its series after (baton.app.observability.prometheus).
METRICS_STYLES = ("baton", "vllm", "both")
EVENT_LOOPS = ("asyncio", "uvloop")
MAX_PORT = 65535


def port_number(text: str) -> int:
    """--port's value, refused by the parser when it is no TCP port: the socket would raise
    OverflowError only once the server binds."""
    try:
        port: int | None = int(text)
    except ValueError:
        port = None
    if port is None or not 0 <= port <= MAX_PORT:
        raise ValueError(
            f"must be a port number from 0 to {MAX_PORT} (0: any free port), got {text!r}"
        )
    return port


@dataclass(slots=True)
class ServerSettings(RequestBounds):
    """What `baton serve` listens on, whom it answers, its limits (a request's own cost bounds
    among them), SLO defaults and telemetry."""

    host: str = setting("127.0.0.1", help="the address to listen on")
    port: int = setting(8000, parse=port_number, help="the port to listen on (0: any free port)")
    served_model_name: str | None = setting(
        None,
        help="the model's name in the API (/v1/models, the model field)",
        default_text="the --model folder's name",
    )
    api_keys: list[str] = setting(
        name="--api-key",
        repeatable=True,
        default_factory=list,
        help="require this bearer key (repeatable; or set BATON_API_KEY)",
        default_text="no key",
    )
    allowed_origins: list[str] = setting(
        default_factory=list,
        parse=comma_list,
        help="comma-separated origins allowed for CORS and WebSocket upgrades",
    )
    # Host names answered beyond loopback's own when bound to loopback
    # (baton.app.http.hosts_and_origins).
    allowed_hosts: list[str] = setting(
        default_factory=list,
        parse=comma_list,
        help="comma-separated Host names to answer (*.example.org for subdomains, * for any); "
        "on a loopback --host, loopback names are always answered and nothing else by default",
    )
    max_queued_requests: int = setting(
        256, help="requests that may wait beside a full batch; more are refused (429)"
    )
    # Bodies past this get 413 before they are read whole.
    max_body_bytes: int = 4 * 1024 * 1024
    shutdown_timeout_s: float = setting(
        30.0,
        name="--shutdown-timeout",
        help="seconds a stopping server lets running streams finish before it cuts them",
    )
    # The request target and header fields past this get 431 (baton.app.http.http_limits).
    max_header_bytes: int = setting(
        64 * 1024, help="answer 431 to a request whose target and header fields are larger"
    )
    header_timeout_s: float = setting(
        10.0,
        name="--header-timeout",
        help="seconds a request's headers may take to arrive (408 and close after)",
    )
    body_timeout_s: float = setting(
        30.0,
        name="--body-timeout",
        help="seconds a request's body may take to arrive once its headers have (408 and close "
        "after); streamed responses are not limited",
    )
    # Past this a connection's producers wait and its WebSocket frames (pings too) go unread
    # (baton.app.http.send_backlog).
    send_buffer_bytes: int = setting(
        64 * 1024,
        help="bytes a connection may hold unsent (response chunks, WebSocket frames, pongs) "
        "before its streams wait and its frames go unread",
    )
    send_timeout_s: float = setting(
        30.0,
        name="--send-timeout",
        help="seconds a connection past --send-buffer-bytes may go without its client taking "
        "any of it (a client that stopped reading) before it is dropped and its requests "
        "aborted",
    )
    ttft_slo_ms: float | None = setting(
        None,
        help="the time-to-first-token target in ms of requests that set none",
        default_text="none",
    )
    tpot_slo_ms: float | None = setting(
        None,
        help="the time-per-output-token target in ms of requests that set none",
        default_text="none",
    )
    otlp_traces_endpoint: str | None = setting(
        None,
        help="export request traces over OTLP/HTTP to this URL (e.g. http://localhost:4318)",
        default_text="no export",
    )
    trace_console: bool = setting(False, help="print request traces to stdout (debugging)")
    # The sliding window /v1/stats reports over.
    stats_window_s: float = 60.0
    # Off only to measure what metrics cost (benchmarks/server_throughput.py): the engine's
    # step and finish listeners are then not attached and the aggregates stay at zero.
    record_metrics: bool = True
    # The format `tool_choice: auto` parses calls in (baton.app.api.tools.tool_parsers); None: read
    # it off the chat template.
    tool_call_parser: str | None = setting(
        None,
        choices=tuple(sorted(PARSERS)),
        help="the format the model writes tool calls in, for tool_choice 'auto'",
        default_text="read off the chat template: <tool_call> is hermes, [TOOL_CALLS] mistral, "
        "<|python_tag|> llama3_json",
    )
    # The model's thinking format: chat answers split it off as `reasoning_content`
    # (baton.app.api.reasoning).
    reasoning_parser: str | None = setting(
        None,
        choices=tuple(sorted(REASONING_PARSERS)),
        help="split a reasoning model's <think>...</think> text off chat answers as "
        "reasoning_content; structured output then starts after the thinking",
        default_text="none: the thinking stays in content",
    )
    # Names on /metrics: Baton's (`baton:`), vLLM's (`vllm:`, for its dashboards), or both.
    metrics_style: str = setting(
        "baton",
        choices=METRICS_STYLES,
        help="names on /metrics: baton: (Baton's), vllm: (vLLM's names and labels, so vLLM's "
        "Grafana dashboards work unchanged; series vLLM lacks keep baton:), or both",
    )
    # How /v1/embeddings pools an input's final hidden states (baton.core.pooling).
    pooling: str = setting(
        "last",
        choices=tuple(p.value for p in Pooling),
        help="how /v1/embeddings pools the final hidden states: last (the prompt's last token, "
        "as causal embedding models are trained) or mean (every token; skips the prefix cache)",
    )
    # The event loop uvicorn runs on. asyncio's own lets the step thread run while a socket
    # write is in the kernel: uvloop holds the GIL through each write, and the step thread
    # waits for it every token, which lengthens a lone stream's TPOT (docs/decisions.md).
    event_loop: str = setting(
        "asyncio",
        choices=EVENT_LOOPS,
        help="the event loop serving HTTP and WebSockets: asyncio's own (it lets the step "
        "thread run while a token is written to a socket) or uvloop",
    )
    # Where a request's omitted sampling fields come from (baton.app.request_defaults).
    generation_config: str = setting(
        "auto",
        metavar="auto|none|DIR",
        help="the sampling defaults for fields a request leaves out (temperature, top_p, top_k, "
        "min_p, repetition_penalty, max_new_tokens as max_tokens): auto takes the checkpoint's "
        "generation_config.json, none the API's own, a folder (or file) its "
        "generation_config.json",
    )
    chat_template: str | None = setting(
        None,
        metavar="FILE",
        help="a Jinja chat template file to use instead of the checkpoint's (or the template "
        "itself, inline)",
        default_text="the checkpoint's: tokenizer_config.json's, or chat_template.jinja beside it",
    )

    @property
    def exports_spans(self) -> bool:
        """Whether a flag asks for request traces (baton.app.observability.telemetry exports
        them)."""
        return bool(self.otlp_traces_endpoint) or self.trace_console

    def __post_init__(self) -> None:
        RequestBounds.__post_init__(self)
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
        if self.send_buffer_bytes < 1:
            raise ValueError(f"--send-buffer-bytes must be >= 1, got {self.send_buffer_bytes}")
        for flag, seconds in [
            ("--header-timeout", self.header_timeout_s),
            ("--body-timeout", self.body_timeout_s),
            ("--send-timeout", self.send_timeout_s),
        ]:
            if not 0 < seconds < math.inf:
                raise ValueError(f"{flag} must be a positive number of seconds, got {seconds}")
        if any(not key for key in self.api_keys):
            raise ValueError("--api-key must not be empty")
