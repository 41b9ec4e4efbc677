"""Locust users for Baton: `ChatSSEUser` streams `/v1/chat/completions` from any
OpenAI-compatible server; `WebSocketUser` multiplexes several requests on one `/v1/ws` socket,
like the chat UI. Both report TTFT, ITL, TPOT, E2E, output tokens and SLO rows (see
loadtest/stream_metrics.py); `SelectedShape` drives the user count (see loadtest/README.md).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket as socket_module
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import requests
import websockets
from locust import LoadTestShape, User, events, task
from websockets.sync.client import ClientConnection, connect

# `locust -f loadtest/locustfile.py` imports this file as a top-level module, not as a package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.stream_metrics import SLO, MetricReporter, StreamError, StreamTimer
from loadtest.workloads import (
    PREFIX_MODES,
    PROFILES,
    WORKLOAD_NAMES,
    RequestSampler,
    RequestSpec,
    WorkloadConfig,
    chat_body,
)

logger = logging.getLogger("loadtest")

REQUEST_TIMEOUT_S = 600.0
# Step and spike shapes are laid out over --run-time; without one, over this period.
DEFAULT_SHAPE_PERIOD_S = 300.0
_user_indexes = itertools.count()
_models: dict[str, str] = {}


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    parser.add_argument("--workload", choices=WORKLOAD_NAMES, default="chat")
    parser.add_argument("--max-tokens", type=int, default=0, help="fixed output length (0: drawn)")
    parser.add_argument(
        "--prompt-tokens", type=int, default=0, help="fixed prompt words (0: drawn)"
    )
    parser.add_argument("--prefix", choices=PREFIX_MODES, default="none", help="system prompt")
    parser.add_argument("--prefix-tokens", type=int, default=256)
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly max_tokens")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--logprobs", action="store_true", help="count tokens exactly (SSE)")
    parser.add_argument("--slo-ttft-ms", type=float, default=0, help="0: no TTFT SLO rows")
    parser.add_argument("--slo-tpot-ms", type=float, default=0, help="0: no TPOT SLO rows")
    parser.add_argument("--api-key", default="", help="bearer key", is_secret=True)
    parser.add_argument("--model", default="", help="model id (default: first of /v1/models)")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--think-time", type=float, default=0, help="mean seconds between tasks")
    parser.add_argument("--arrival-rate", type=float, default=0, help="requests/s over all users")
    parser.add_argument("--ws-concurrency", type=int, default=4, help="requests per socket")
    parser.add_argument("--shape", choices=tuple(PROFILES), default="constant")


def workload_config(options: Any) -> WorkloadConfig:
    return WorkloadConfig(
        workload=options.workload,
        prompt_tokens=options.prompt_tokens,
        max_tokens=options.max_tokens,
        prefix=options.prefix,
        prefix_tokens=options.prefix_tokens,
        seed=options.workload_seed,
    )


def describe(error: Exception) -> str:
    # Our own errors already say what happened; a library's needs its type to be readable.
    return str(error) if isinstance(error, StreamError) else f"{type(error).__name__}: {error}"


def auth_headers(options: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}


def served_model(host: str, options: Any) -> str:
    """--model, or the first model the server lists (asked once per host and process)."""
    if options.model:
        return options.model
    if host not in _models:
        response = requests.get(f"{host}/v1/models", headers=auth_headers(options), timeout=30)
        response.raise_for_status()
        _models[host] = response.json()["data"][0]["id"]
    return _models[host]


class BatonUser(User):
    """What both transports share: options, workload sampling, pacing and the reporter."""

    abstract = True
    transport = ""
    requests_per_task = 1

    def on_start(self) -> None:
        self.options = self.environment.parsed_options
        self.sampler = RequestSampler(workload_config(self.options), next(_user_indexes))
        slo = SLO(self.options.slo_ttft_ms, self.options.slo_tpot_ms)
        self.reporter = MetricReporter(self.environment.events, self.transport, slo)
        self.model = served_model(self.host.rstrip("/"), self.options)
        self.next_arrival = time.perf_counter()
        if self.options.arrival_rate > 0:
            # Start at a random phase: users spawned together must not send their first
            # requests as one burst (and stay in step after it).
            time.sleep(self.wait_time())

    def wait_time(self) -> float:
        """Think time, or with --arrival-rate the wait until this user's next arrival.

        Each user's arrivals form a Poisson process at its share of the rate, so together they
        are a Poisson process at the whole rate. Arrivals are scheduled from the previous
        arrival, not from when the last request finished, so slow responses do not lower the
        offered load (as long as there are enough users to keep up)."""
        rate = self.options.arrival_rate
        if rate <= 0:
            think = self.options.think_time
            return self.sampler.rng.expovariate(1 / think) if think > 0 else 0.0
        runner = self.environment.runner
        users = max(1, runner.target_user_count or runner.user_count)
        interval = self.requests_per_task * users / rate
        self.next_arrival += self.sampler.rng.expovariate(1 / interval)
        return max(0.0, self.next_arrival - time.perf_counter())

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        return chat_body(spec, self.model, self.options)


class ChatSSEUser(BatonUser):
    """Streams chat completions over SSE and times every chunk as it arrives."""

    transport = "SSE"

    def on_start(self) -> None:
        super().on_start()
        self.session = requests.Session()
        self.session.headers.update(auth_headers(self.options))

    @task
    def stream_chat(self) -> None:
        body = self.body(self.sampler.sample())
        body.update(stream=True, stream_options={"include_usage": True})
        if self.options.logprobs:
            body["logprobs"] = True
        timer = StreamTimer.started()
        try:
            usage_tokens = self._read_stream(body, timer)
        except (requests.RequestException, StreamError, ValueError, KeyError) as error:
            self.reporter.failed(timer, describe(error))
            return
        self.reporter.completed(timer, usage_tokens, self._count_error(timer, usage_tokens))

    def _read_stream(self, body: dict[str, Any], timer: StreamTimer) -> int:
        url = f"{self.host.rstrip('/')}/v1/chat/completions"
        with self.session.post(url, json=body, stream=True, timeout=REQUEST_TIMEOUT_S) as response:
            if response.status_code != 200:
                raise StreamError(f"HTTP {response.status_code}: {response.text[:300]}")
            usage_tokens = None
            for event in sse_events(response):
                self._on_chunk(event, timer)
                if event.get("usage"):
                    usage_tokens = event["usage"]["completion_tokens"]
        if usage_tokens is None:
            raise StreamError("the stream ended without a usage chunk (stream_options ignored?)")
        return usage_tokens

    def _on_chunk(self, event: dict[str, Any], timer: StreamTimer) -> None:
        if "error" in event:
            raise StreamError(f"error event: {event['error']}")
        for choice in event.get("choices") or ():
            logprobs = choice.get("logprobs") or {}
            # A chunk carries one logprobs entry per token, even when its text is held back.
            timer.tokens += len(logprobs.get("content") or ())
            if (choice.get("delta") or {}).get("content"):
                timer.on_text()

    def _count_error(self, timer: StreamTimer, usage_tokens: int) -> str | None:
        if self.options.logprobs and timer.tokens != usage_tokens:
            return f"counted {timer.tokens} tokens in logprobs, usage says {usage_tokens}"
        if timer.chunks > usage_tokens:
            return f"{timer.chunks} text chunks but usage says {usage_tokens} tokens"
        return None


def sse_events(response: requests.Response) -> Iterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream, up to `data: [DONE]`. chunk_size=None hands over each
    HTTP chunk as it arrives, so chunk times are arrival times."""
    for line in response.iter_lines(chunk_size=None):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield orjson.loads(data)


@dataclass(slots=True)
class InFlight:
    """A WebSocket request awaiting its done frame."""

    timer: StreamTimer = field(default_factory=StreamTimer.started)
    index_error: str | None = None


class WebSocketUser(BatonUser):
    """Sends --ws-concurrency generate frames at once on one socket and reads the interleaved
    token frames until all are done, as the chat UI does with several conversations."""

    transport = "WS"

    def on_start(self) -> None:
        super().on_start()
        self.requests_per_task = max(1, self.options.ws_concurrency)
        self.socket: ClientConnection | None = None
        self.request_ids = itertools.count()

    def on_stop(self) -> None:
        self._drop_socket()

    @task
    def generate_burst(self) -> None:
        pending: dict[str, InFlight] = {}
        try:
            socket = self._connected()
            for _ in range(self.requests_per_task):
                request_id = f"r{next(self.request_ids)}"
                frame = {"type": "generate", "id": request_id, **self.body(self.sampler.sample())}
                pending[request_id] = InFlight()
                socket.send(orjson.dumps(frame).decode())
            while pending:
                self._on_frame(orjson.loads(socket.recv(timeout=REQUEST_TIMEOUT_S)), pending)
        except (OSError, TimeoutError, websockets.WebSocketException, StreamError) as error:
            for record in pending.values():
                self.reporter.failed(record.timer, describe(error))
            self._drop_socket()

    def _connected(self) -> ClientConnection:
        if self.socket is None:
            url = self.host.rstrip("/").replace("http", "ws", 1) + "/v1/ws"
            headers = auth_headers(self.options)
            self.socket = connect(url, additional_headers=headers, max_size=None)
        return self.socket

    def _drop_socket(self) -> None:
        # A socket in an unknown state may still deliver frames of abandoned requests.
        if self.socket is not None:
            # Shut the TCP socket down first: that wakes the connection's reader (a greenlet
            # under locust) so it leaves the fd before close(); closing an fd it still watches
            # aborts gevent's event loop at exit.
            with contextlib.suppress(OSError):
                self.socket.socket.shutdown(socket_module.SHUT_RDWR)
            self.socket.close()
            self.socket = None

    def _on_frame(self, frame: dict[str, Any], pending: dict[str, InFlight]) -> None:
        record = pending.get(frame.get("id"))
        if record is None:
            raise StreamError(f"unexpected frame: {str(frame)[:300]}")
        if frame["type"] == "token":
            if frame["index"] != record.timer.chunks:
                record.index_error = f"token frame {frame['index']}, expected {record.timer.chunks}"
            record.timer.on_text()
        elif frame["type"] == "done":
            del pending[frame["id"]]
            self._on_done(frame, record)
        elif frame["type"] == "error":
            del pending[frame["id"]]
            self.reporter.failed(record.timer, f"error frame: {frame['error']}")

    def _on_done(self, frame: dict[str, Any], record: InFlight) -> None:
        if frame["finish_reason"] not in ("stop", "length"):
            self.reporter.failed(record.timer, f"finished with {frame['finish_reason']}")
            return
        usage_tokens = frame["usage"]["completion_tokens"]
        error = record.index_error
        if error is None and record.timer.chunks > usage_tokens:
            error = f"{record.timer.chunks} token frames but usage says {usage_tokens} tokens"
        self.reporter.completed(record.timer, usage_tokens, error)


class SelectedShape(LoadTestShape):
    """The user count over time: --shape constant (-u users), step (ramp to -u in five steps)
    or spike (-u/4 with a burst to -u mid-run), over --run-time; spawning at -r per second."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        elapsed = self.get_run_time()
        if options.run_time and elapsed >= options.run_time:
            return None
        period = options.run_time or DEFAULT_SHAPE_PERIOD_S
        users = PROFILES[options.shape](elapsed, options.num_users or 1, period)
        return users, options.spawn_rate or 1
