"""The TTFT forecast behind SLO admission control: from the requests in flight, the step-cost
model and the measured request lifetime, predict when a new request would get its first token
under the `slo` policy, and how long the queue takes to drain.

It keeps its own ledger of requests in flight (added on submission, settled at their first
token, dropped when they end) so that the thread admitting requests — the event loop — reads
only its own state and the cost fit the engine last published, never the scheduler's queues
or the live model, which the step thread is changing.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from core.arrival_rate import ArrivalRate
from core.request import SLO
from core.slo_policy import PATIENCE_S
from core.step_cost import StepCost, prefill_seconds

# Weight of the newest finished request in the running mean of request lifetimes.
LIFETIME_EMA_WEIGHT = 0.05
# The `slo` policy promotes a request ahead of every deadline once this share of the starvation
# bound has passed and what is left only just covers the work ahead of it.
AGING_EARLIEST_SHARE = 0.5
# Rounds of the place wait's fixed point (the wait lets more requests join ahead, which
# lengthens the wait); it settles within a few when places free faster than they join.
PLACE_WAIT_ITERATIONS = 16


@dataclass(slots=True)
class _InFlight:
    num_prompt_tokens: int
    arrival_s: float
    deadline_s: float  # arrival + TTFT target; infinite without a target
    first_token_s: float | None = None


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

    def __init__(
        self,
        cost_model: StepCost,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_wait_s: float,
    ) -> None:
        self.cost_model = cost_model
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_wait_s = max_wait_s
        self._in_flight: dict[str, _InFlight] = {}
        # Mean seconds from first token to finish: a full batch frees a place every mean
        # lifetime / batch size (renewal), the `slo` policy's place gap.
        self.lifetime_s = 0.0
        # Requests arriving later with an earlier deadline also go ahead, each taking a place.
        self.arrivals = ArrivalRate()

    def add(self, request_id: str, num_prompt_tokens: int, slo: SLO | None, now: float) -> None:
        ttft_ms = slo.ttft_ms if slo is not None else None
        deadline = math.inf if ttft_ms is None else now + ttft_ms / 1000
        self._in_flight[request_id] = _InFlight(num_prompt_tokens, now, deadline)
        self.arrivals.add(now, None if ttft_ms is None else ttft_ms / 1000)

    def first_token(self, request_id: str, now: float) -> None:
        entry = self._in_flight.get(request_id)
        if entry is not None and entry.first_token_s is None:
            entry.first_token_s = now

    def remove(self, request_id: str, now: float) -> None:
        entry = self._in_flight.pop(request_id, None)
        if entry is not None and entry.first_token_s is not None:
            lifetime = now - entry.first_token_s
            if self.lifetime_s == 0.0:
                self.lifetime_s = lifetime
            else:
                self.lifetime_s += LIFETIME_EMA_WEIGHT * (lifetime - self.lifetime_s)

    @property
    def num_owed(self) -> int:
        """Requests in flight still waiting for their first token."""
        return sum(entry.first_token_s is None for entry in self._in_flight.values())

    def predict(self, num_prompt_tokens: int, ttft_ms: float | None, now: float) -> Forecast:
        """When a request arriving `now` would get its first token, as the `slo` policy would
        serve it: behind the requests it promotes for the starvation bound and those with an
        earlier deadline it keeps on time (earliest deadline first, setting aside the largest
        prefill when one would miss: Moore-Hodgson), each needing a place in the batch. One the
        policy would set aside itself waits behind the on-time work, up to the bound when it
        is patient."""
        deadline = math.inf if ttft_ms is None else now + ttft_ms / 1000
        decodes = context = owed = 0
        forced: list[_InFlight] = []
        ordered: list[_InFlight] = []
        promote_after = now - AGING_EARLIEST_SHARE * self.max_wait_s
        for entry in self._in_flight.values():
            if entry.first_token_s is not None:
                decodes += 1
                context += entry.num_prompt_tokens
                continue
            owed += entry.num_prompt_tokens
            if entry.arrival_s <= promote_after and entry.arrival_s + self.max_wait_s <= deadline:
                forced.append(entry)
            elif entry.deadline_s <= deadline:
                ordered.append(entry)
        cost = self.cost_model
        decode_s = cost.predict_step(0, decodes, context)
        pace = max(1, self.max_num_batched_tokens - decodes)
        per_token_s = cost.prefill_token_s()

        def prefill_s(tokens: int) -> float:
            return prefill_seconds(tokens, pace, decode_s, per_token_s)

        # Places the batch has for requests still owed prefill, and the seconds between two
        # places freeing once it is full.
        places_free = self.max_num_seqs - decodes
        gap_s = self.lifetime_s / self.max_num_seqs

        def first_token_s(tokens: int, places: int, own: int, deadline_s: float) -> float:
            place_s = self._place_wait_s(places - places_free, gap_s, deadline_s - now)
            return max(prefill_s(tokens), place_s + prefill_s(own))

        ordered.sort(key=lambda entry: entry.deadline_s)
        tokens = sum(entry.num_prompt_tokens for entry in forced)
        places = len(forced)
        largest: list[tuple[int, int]] = []  # heap of (−prompt, index) kept
        for index, entry in enumerate(ordered):
            own = entry.num_prompt_tokens
            tokens += own
            places += 1
            heapq.heappush(largest, (-own, index))
            if entry.deadline_s - now < first_token_s(tokens, places, own, entry.deadline_s):
                dropped = -heapq.heappop(largest)[0]
                tokens -= dropped
                places -= 1
        tokens += num_prompt_tokens
        places += 1
        ttft_s = first_token_s(tokens, places, num_prompt_tokens, deadline)
        while ttft_s > deadline - now and largest and -largest[0][0] > num_prompt_tokens:
            tokens += heapq.heappop(largest)[0]
            places -= 1
            ttft_s = first_token_s(tokens, places, num_prompt_tokens, deadline)
        if ttft_s > deadline - now >= PATIENCE_S:
            # Set aside and patient: it follows every on-time request, which keep coming as
            # long as the overload lasts, so it waits for the starvation bound. (An urgent one
            # set aside is taken soon among the late, by priority.)
            ttft_s = max(ttft_s, self.max_wait_s)
        return Forecast(
            ttft_s=ttft_s,
            alone_s=prefill_s(num_prompt_tokens),
            drain_s=prefill_s(owed),
        )

    def _place_wait_s(self, num_ahead: int, gap_s: float, deadline_s: float) -> float:
        """Seconds until a place frees for a request with `num_ahead` requests before it in
        the queue for places, one freeing every `gap_s`, while arrivals with an earlier
        deadline than its own (`deadline_s` from now) keep joining ahead of it."""
        if num_ahead <= 0 or gap_s <= 0:
            return 0.0
        wait_s = num_ahead * gap_s
        for _ in range(PLACE_WAIT_ITERATIONS):
            joined = self.arrivals.expected_ahead(wait_s, deadline_s)
            longer_s = (num_ahead + joined) * gap_s
            if longer_s - wait_s < gap_s / 2:
                return longer_s
            wait_s = longer_s
        return wait_s
