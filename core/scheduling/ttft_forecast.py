"""The TTFT forecast behind SLO admission control: from the requests in flight, the step-cost
model and the measured request lifetime, predict when a new request would get its first token under
the `slo` policy, and how long the queue takes to drain. It orders the queue with the planner's own
function (core/scheduling/feasibility.py), so admission and the planner cannot disagree.

It keeps its own ledger of requests in flight (added on submission, settled at their first
token, dropped when they end) so that the thread admitting requests — the event loop — reads
only its own state and the cost fit the engine last published, never the scheduler's queues
or the live model, which the step thread is changing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from baton.core.request import SLO
from baton.core.scheduling import feasibility
from baton.core.scheduling.feasibility import Job, Pace
from baton.core.scheduling.step_cost import StepCost

# The key of the request being forecast among the queue's jobs; it sorts after every request
# id, so of requests alike in deadline and arrival it goes last, as the newest.
_NEW = "\U0010ffff"


@dataclass(slots=True)
class _InFlight:
    num_prompt_tokens: int
    arrival_s: float
    deadline_s: float  # arrival + TTFT target; infinite without a target
    tpot_s: float  # TPOT target; infinite without one
    first_token_s: float | None = None


@dataclass(slots=True, frozen=True)
class Forecast:
    """Predicted seconds to a new request's first token, behind the queue and on an idle
    engine, and to drain the whole queue's prefill."""

    ttft_s: float
    alone_s: float
    drain_s: float
    # Requests in flight predicted on time without the new request and late with it.
    displaced: int = 0

    def refuses(self, ttft_ms: float, factor: float) -> bool:
        """SLO admission control's rule at arrival: refuse a request whose first token is
        predicted later than `factor` times its target because of the queue, or that would
        push two or more accepted requests from on time to late (one is a wash: one request
        on time either way, and the prediction may be wrong). One that would fit its target
        on an idle engine only: otherwise it is the request, not the queue, that makes it
        late. A factor of 0 refuses nothing."""
        target_s = ttft_ms / 1000
        if factor <= 0 or self.alone_s > target_s:
            return False
        return self.ttft_s > factor * target_s or self.displaced > 1


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
        # The engine's published mean request lifetime (core/scheduling/lifetime.py), the planner's.
        self.lifetime_s = 0.0

    def add(self, request_id: str, num_prompt_tokens: int, slo: SLO | None, now: float) -> None:
        ttft_ms = slo.ttft_ms if slo is not None else None
        tpot_ms = slo.tpot_ms if slo is not None else None
        deadline = math.inf if ttft_ms is None else now + ttft_ms / 1000
        tpot_s = math.inf if tpot_ms is None else tpot_ms / 1000
        self._in_flight[request_id] = _InFlight(num_prompt_tokens, now, deadline, tpot_s)

    def first_token(self, request_id: str, now: float) -> None:
        entry = self._in_flight.get(request_id)
        if entry is not None and entry.first_token_s is None:
            entry.first_token_s = now

    def remove(self, request_id: str) -> None:
        self._in_flight.pop(request_id, None)

    @property
    def owed_tokens(self) -> int:
        """Prompt tokens in flight still to prefill (each whole until its first token)."""
        return sum(e.num_prompt_tokens for e in self._in_flight.values() if e.first_token_s is None)

    @property
    def num_owed(self) -> int:
        """Requests in flight still waiting for their first token."""
        return sum(entry.first_token_s is None for entry in self._in_flight.values())

    def decode_load(self) -> tuple[int, int, float]:
        """The in-flight requests past their first token: how many, the KV entries they read
        a step, and their tightest TPOT target in seconds (infinite without one)."""
        decodes = context = 0
        tightest_s = math.inf
        for entry in self._in_flight.values():
            if entry.first_token_s is not None:
                decodes += 1
                context += entry.num_prompt_tokens
                tightest_s = min(tightest_s, entry.tpot_s)
        return decodes, context, tightest_s

    def decodes(self) -> list[tuple[str, float, float]]:
        """The in-flight requests past their first token: id, when it came, and TPOT target in
        seconds (infinite without one)."""
        return [
            (key, entry.first_token_s, entry.tpot_s)
            for key, entry in self._in_flight.items()
            if entry.first_token_s is not None
        ]

    def tpot_targets(self) -> set[float]:
        """The TPOT targets, in seconds, of the requests in flight (infinite without one)."""
        return {entry.tpot_s for entry in self._in_flight.values()}

    def capped_prefill_budget(self) -> int:
        """The prefill tokens a step carries beside the in-flight decodes under the `slo`
        planner's TPOT cap (`feasibility.tpot_capped_budget`)."""
        decodes, context, tightest_s = self.decode_load()
        budget = self.max_num_batched_tokens - decodes
        if tightest_s == math.inf:
            return budget
        return feasibility.tpot_capped_budget(self.cost_model, decodes, context, tightest_s, budget)

    def predict(
        self,
        num_prompt_tokens: int,
        ttft_ms: float | None,
        now: float,
        prefill_budget: int | None = None,
    ) -> Forecast:
        """When a request arriving `now` would get its first token, as the `slo` planner would
        order it among the requests still owed a first token (`feasibility.plan_order`), at
        the pace the in-flight decodes allow, and how many of those it would make late. One
        predicted past its deadline is not refused for that alone: if it does drop out of
        reach, the planner sets it aside and, having used nothing, it is refused once it has
        waited the factor times its target (`SLOPolicy.refuse`); a borderline prediction at
        moderate load is often wrong, and refusing it would be a sure miss. `prefill_budget`
        limits the prefill each step carries (None: the token budget beside the decodes)."""
        decodes = context = owed = 0
        jobs = []
        for key, entry in self._in_flight.items():
            if entry.first_token_s is not None:
                decodes += 1
                context += entry.num_prompt_tokens
                continue
            owed += entry.num_prompt_tokens
            jobs.append(
                Job(key, entry.arrival_s, entry.deadline_s, entry.num_prompt_tokens, True, False)
            )
        deadline = math.inf if ttft_ms is None else now + ttft_ms / 1000
        without = self.pace(decodes, context, jobs, prefill_budget)
        before = feasibility.first_token_times(
            feasibility.plan_order(jobs, without, now), without, now
        )
        jobs.append(Job(_NEW, now, deadline, num_prompt_tokens, True, False))
        pace = self.pace(decodes, context, jobs, prefill_budget)
        ordered = feasibility.plan_order(jobs, pace, now)
        times = feasibility.first_token_times(ordered, pace, now)
        ttft_s = times[_NEW] - now
        displaced = sum(
            before[job.key] <= job.deadline_s < times[job.key] for job in jobs if job.key != _NEW
        )
        return Forecast(
            ttft_s=min(ttft_s, self.max_wait_s),
            alone_s=dataclasses.replace(pace, queued_tokens=0).prefill_s(num_prompt_tokens),
            drain_s=without.prefill_s(owed),
            displaced=displaced,
        )

    def pace(
        self,
        num_decodes: int,
        num_context: int,
        owed: list[Job],
        prefill_budget: int | None = None,
    ) -> Pace:
        """The planner's pace with the in-flight decodes riding in every step: the rest of the
        token budget (or `prefill_budget`, if less) for prefill, and a place freeing every mean
        lifetime / batch size once the batch is full."""
        free_places = self.max_num_seqs - num_decodes
        tokens_per_step = self.max_num_batched_tokens - num_decodes
        if prefill_budget is not None:
            tokens_per_step = min(tokens_per_step, prefill_budget)
        return feasibility.pace_of(
            self.cost_model,
            tokens_per_step,
            num_decodes,
            num_context,
            free_places,
            self.lifetime_s,
            self.max_num_seqs,
            feasibility.riding_tokens(owed, free_places),
        )
