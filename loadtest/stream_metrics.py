"""Per-request streaming measurements (TTFT, inter-token gaps, TPOT, end-to-end, output tokens,
SLO met or missed) and their report to locust as request events, one stats row per metric.

Rows are keyed (transport, metric): request_type is "SSE" or "WS", name is the metric, and
response_time is its value in milliseconds — except "output tokens", whose value is the count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# Stats row names; the smoke test and README refer to them.
TTFT = "TTFT"
ITL = "ITL"
TPOT = "TPOT"
E2E = "E2E"
OUTPUT_TOKENS = "output tokens"
SLO_TTFT = "SLO ttft"
SLO_TPOT = "SLO tpot"


class StreamError(Exception):
    """The server answered, but the stream broke the protocol or reported an error."""


@dataclass(slots=True)
class StreamTimer:
    """Arrival times of one request's text chunks. A chunk is one server message with text; it
    may hold several tokens, so token counts come from `tokens` (logprobs) or from usage."""

    start: float
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    tokens: int = 0

    @classmethod
    def started(cls) -> StreamTimer:
        return cls(time.perf_counter())

    def on_text(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.chunks += 1


@dataclass(frozen=True, slots=True)
class SLO:
    """Targets in milliseconds; 0 turns a check off."""

    ttft_ms: float = 0
    tpot_ms: float = 0


class MetricReporter:
    """Fires locust request events for one transport."""

    def __init__(self, events: Any, transport: str, slo: SLO) -> None:
        self.events = events
        self.transport = transport
        self.slo = slo

    def fire(self, name: str, value: float, length: int = 0, error: str | None = None) -> None:
        self.events.request.fire(
            request_type=self.transport,
            name=name,
            response_time=value,
            response_length=length,
            exception=StreamError(error) if error else None,
            context={},
        )

    def failed(self, timer: StreamTimer, error: str) -> None:
        """A request that did not complete counts once, as a failed E2E entry."""
        self.fire(E2E, _ms(time.perf_counter() - timer.start), error=error)

    def completed(self, timer: StreamTimer, usage_tokens: int, count_error: str | None) -> None:
        """Report every metric of a finished request; `count_error` says why the tokens the
        client saw disagree with the server's usage, if they do."""
        e2e = _ms(time.perf_counter() - timer.start)
        self.fire(E2E, e2e, length=usage_tokens)
        self.fire(OUTPUT_TOKENS, usage_tokens, length=usage_tokens, error=count_error)
        if timer.first is None:
            return  # an immediate end of sequence: a valid answer with no first token to time
        ttft = _ms(timer.first - timer.start)
        self.fire(TTFT, ttft)
        self._check_slo(SLO_TTFT, ttft, self.slo.ttft_ms)
        if timer.chunks > 1:
            self.fire(ITL, _ms(timer.last - timer.first) / (timer.chunks - 1))
        if usage_tokens > 1:
            tpot = (e2e - ttft) / (usage_tokens - 1)
            self.fire(TPOT, tpot)
            self._check_slo(SLO_TPOT, tpot, self.slo.tpot_ms)

    def _check_slo(self, name: str, value: float, target: float) -> None:
        if target > 0:
            missed = f"{value:.1f} ms > {target:g} ms" if value > target else None
            self.fire(name, value, error=missed)


def _ms(seconds: float) -> float:
    return seconds * 1000
