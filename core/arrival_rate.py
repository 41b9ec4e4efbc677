"""How fast requests with a short TTFT target arrive, over a sliding window: the `slo` policy
keeps enough places free in a full batch for those expected before the next place frees."""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence

from core.request import Request

# Seconds of arrivals the rate is measured over.
WINDOW_S = 10.0
# The rate is never measured over less than this, so the first arrivals do not read as a flood.
MIN_SPAN_S = 1.0


class ArrivalRate:
    """The window's arrivals as a queue (to expire them) and as counts per TTFT target (to
    answer rate questions in time proportional to the few distinct targets, not to the
    arrivals: the TTFT forecast asks once per queued request for every new arrival)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, float]] = deque()  # (arrival time, TTFT target s)
        self._per_target: Counter[float] = Counter()
        self._newest = -math.inf
        self._since = math.inf
        self._now = 0.0

    def observe(self, requests: Sequence[Request], now: float) -> None:
        """Record the requests with a TTFT target that arrived since the last call (every
        request waits, and is seen, at least once before it is admitted)."""
        newest = self._newest
        for request in requests:
            if request.arrival_time > self._newest and request.slo.ttft_ms is not None:
                self._record(request.arrival_time, request.slo.ttft_ms / 1000)
            newest = max(newest, request.arrival_time)
        self._newest = newest
        self._expire(now)
        self._now = now

    def add(self, arrival_s: float, ttft_s: float | None) -> None:
        """Record one request as it arrives (for a caller that sees each arrival once)."""
        if ttft_s is not None:
            self._record(arrival_s, ttft_s)
        self._newest = max(self._newest, arrival_s)
        self._now = max(self._now, arrival_s)
        self._expire(self._now)

    def _record(self, arrival_s: float, ttft_s: float) -> None:
        self._arrivals.append((arrival_s, ttft_s))
        self._per_target[ttft_s] += 1
        self._since = min(self._since, arrival_s)

    def _expire(self, now: float) -> None:
        while self._arrivals and self._arrivals[0][0] < now - self.window_s:
            _, ttft_s = self._arrivals.popleft()
            self._per_target[ttft_s] -= 1
            if not self._per_target[ttft_s]:
                del self._per_target[ttft_s]

    def _span_s(self) -> float:
        return max(MIN_SPAN_S, min(self.window_s, self._now - self._since))

    def expected_ahead(self, within_s: float, deadline_s: float) -> float:
        """Requests expected to arrive in the next `within_s` seconds with a TTFT deadline
        earlier than `deadline_s` seconds from now (one with target τ must come before
        `deadline_s` − τ), at the measured rates."""
        if not self._arrivals or within_s <= 0:
            return 0.0
        total = sum(
            count * max(0.0, min(within_s, deadline_s - target_s))
            for target_s, count in self._per_target.items()
        )
        return total / self._span_s()

    def per_s_below(self, ttft_s: float) -> float:
        """Requests per second arriving with a TTFT target shorter than `ttft_s`."""
        if not self._arrivals:
            return 0.0
        below = sum(count for target_s, count in self._per_target.items() if target_s < ttft_s)
        return below / self._span_s()


def poisson_quantile(mean: float, probability: float) -> int:
    """The smallest n with P(Poisson(mean) <= n) >= probability."""
    if mean > 100:  # exp(-mean) would underflow; the normal approximation is close there
        return math.ceil(mean + 3 * math.sqrt(mean))
    term = cumulative = math.exp(-mean)
    n = 0
    while cumulative < probability:
        n += 1
        term *= mean / n
        cumulative += term
    return n
