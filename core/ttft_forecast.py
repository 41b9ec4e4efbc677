"""The TTFT forecast behind SLO admission control: from the prefill still owed by the requests
in flight and the step-cost model, predict when a new request would get its first token under
the `slo` policy, and how long the queue takes to drain.

It keeps its own ledger of requests in flight (added on submission, settled at their first
token, dropped when they end) so that the thread admitting requests — the event loop — reads
only its own state and the cost model's floats, never the scheduler's queues, which the step
thread is changing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.request import SLO
from core.step_cost import StepCostModel, prefill_seconds


@dataclass(slots=True)
class _InFlight:
    num_prompt_tokens: int
    deadline_s: float  # arrival + TTFT target; infinite without a target
    decoding: bool = False


@dataclass(slots=True, frozen=True)
class Forecast:
    """Predicted seconds to a new request's first token, behind the queue and on an idle
    engine, and to drain the whole queue's prefill."""

    ttft_s: float
    alone_s: float
    drain_s: float

    def refuses(self, ttft_ms: float, factor: float) -> bool:
        """SLO admission control's rule: refuse a request whose first token is predicted later
        than `factor` times its target because of the queue (it would fit its target on an
        idle engine, so it is the queue, not the request, that makes it hopeless). A factor of
        0 refuses nothing."""
        target_s = ttft_ms / 1000
        return factor > 0 and self.ttft_s > factor * target_s and self.alone_s <= target_s


class TTFTForecast:
    """Not thread-safe: one thread (the event loop) calls every method."""

    def __init__(self, cost_model: StepCostModel, max_num_batched_tokens: int) -> None:
        self.cost_model = cost_model
        self.max_num_batched_tokens = max_num_batched_tokens
        self._in_flight: dict[str, _InFlight] = {}

    def add(self, request_id: str, num_prompt_tokens: int, slo: SLO | None, now: float) -> None:
        ttft_ms = slo.ttft_ms if slo is not None else None
        deadline = math.inf if ttft_ms is None else now + ttft_ms / 1000
        self._in_flight[request_id] = _InFlight(num_prompt_tokens, deadline)

    def first_token(self, request_id: str) -> None:
        entry = self._in_flight.get(request_id)
        if entry is not None:
            entry.decoding = True

    def remove(self, request_id: str) -> None:
        self._in_flight.pop(request_id, None)

    @property
    def num_owed(self) -> int:
        """Requests in flight still waiting for their first token."""
        return sum(not entry.decoding for entry in self._in_flight.values())

    def predict(self, num_prompt_tokens: int, ttft_ms: float | None, now: float) -> Forecast:
        """When a request arriving `now` would get its first token. The `slo` policy serves
        earlier deadlines first, so the prefill ahead of it is what requests with a deadline no
        later than its own still owe."""
        deadline = math.inf if ttft_ms is None else now + ttft_ms / 1000
        decodes = context = ahead = owed = 0
        for entry in self._in_flight.values():
            if entry.decoding:
                decodes += 1
                context += entry.num_prompt_tokens
            else:
                owed += entry.num_prompt_tokens
                if entry.deadline_s <= deadline:
                    ahead += entry.num_prompt_tokens
        cost = self.cost_model
        decode_s = cost.predict_step(0, decodes, context)
        pace = max(1, self.max_num_batched_tokens - decodes)
        per_token_s = cost.prefill_token_s()
        return Forecast(
            ttft_s=prefill_seconds(ahead + num_prompt_tokens, pace, decode_s, per_token_s),
            alone_s=prefill_seconds(num_prompt_tokens, pace, decode_s, per_token_s),
            drain_s=prefill_seconds(owed, pace, decode_s, per_token_s),
        )
