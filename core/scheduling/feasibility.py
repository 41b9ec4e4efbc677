"""The feasibility math of SLO scheduling: when a request would get its first token behind the
work ordered ahead of it, how long a full batch makes it wait for a place, and which running
request a preemption costs least. Pure functions over plain values, shared by the scheduler's
hard bounds, the `slo` planner and admission's TTFT forecast, so none of them can disagree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from baton.core.request import Request, RequestStatus
from baton.core.scheduling.step_cost import StepCost

# A request is served ahead of every order once what is left of the starvation bound only just
# covers the prefill ahead of it and its own at full budget, plus this many steps; never before
# this share of the bound has passed (a prompt too long for the bound must not jump every queue
# from the start). Until the last of those steps it waits for a place to free on its own;
# only then does it preempt one.
BOUND_MARGIN_STEPS = 8
BOUND_EARLIEST_SHARE = 0.5
# The least prefill the `slo` planner lets a step carry under a TPOT cap that cannot be met.
MIN_CAPPED_PREFILL = 16


@dataclass(frozen=True, slots=True)
class Pace:
    """How fast the engine works through a queue: each step carries `tokens_per_step` of
    prefill on top of decodes taking `decode_s`, each prefill token adding `per_token_s`;
    `free_places` places in the batch are open now, and once none is, one frees every
    `place_gap_s` (a full batch frees one every mean request lifetime / batch size);
    `queued_tokens` of prefill can share the steps (`riding_tokens`), and while some are left
    every step is filled with them."""

    tokens_per_step: int
    decode_s: float
    per_token_s: float
    free_places: int
    place_gap_s: float
    queued_tokens: int = 0

    def prefill_s(self, num_tokens: int) -> float:
        """Seconds until `num_tokens` of prefill are done at this pace: the steps they need,
        each carrying a full budget while the queue has that much (the step that ends a
        request's prompt carries the next one's too, and takes that long)."""
        steps = max(1, -(-num_tokens // self.tokens_per_step))
        carried = min(steps * self.tokens_per_step, max(num_tokens, self.queued_tokens))
        return steps * self.decode_s + carried * self.per_token_s

    def place_wait_s(self, index: int) -> float:
        """Seconds until the `index`-th request (from 0) wanting a place gets one."""
        gaps = index + 1 - self.free_places
        return gaps * self.place_gap_s if gaps > 0 else 0.0

    def first_token_s(self, tokens: int, places: int, own_tokens: int, needs_place: bool) -> float:
        """Seconds until a request's first token with `tokens` of prefill ordered up to and
        including its own `own_tokens`, and `places` requests (it included, if it needs one)
        wanting a place: the prefill ahead, or its own prefill after its place frees, whichever
        ends later."""
        prefill_s = self.prefill_s(tokens)
        wait_s = self.place_wait_s(places - 1) if needs_place else 0.0
        if wait_s == 0.0:
            return prefill_s  # its own prefill is part of what is ordered up to it
        return max(prefill_s, wait_s + self.prefill_s(own_tokens))


def pace_of(
    cost: StepCost,
    tokens_per_step: int,
    num_decodes: int,
    decode_context: int,
    free_places: int,
    lifetime_s: float,
    batch_size: int,
    queued_tokens: int,
) -> Pace:
    """The pace of a queue behind `num_decodes` running decodes reading `decode_context` KV
    entries, with `tokens_per_step` of prefill a step and `free_places` open places; once
    none is open, one frees every mean request lifetime (first token to finish) / batch size;
    `queued_tokens` of prefill able to share the steps (`riding_tokens`). The planner and the
    forecast build their pace here.
    """
    return Pace(
        max(1, tokens_per_step),
        cost.predict_step(0, num_decodes, decode_context),
        cost.prefill_token_s(),
        free_places,
        lifetime_s / batch_size,
        queued_tokens,
    )


def tpot_capped_budget(
    cost: StepCost, num_decodes: int, decode_context: int, tightest_s: float, token_budget: int
) -> int:
    """The prefill tokens a step may carry beside `num_decodes` decodes reading
    `decode_context` KV entries and still end within `tightest_s`, their tightest TPOT target
    (the `slo` planner's cap, core/scheduling/slo_policy.py, with each decode's target as its
    allowance); at least `MIN_CAPPED_PREFILL`, as the planner keeps the queue moving."""
    room_s = tightest_s - cost.predict_step(0, num_decodes, decode_context)
    per_token_s = cost.prefill_token_s()
    if room_s <= 0:
        return min(token_budget, MIN_CAPPED_PREFILL)
    if per_token_s <= 0:
        return token_budget
    return max(min(token_budget, MIN_CAPPED_PREFILL), int(min(token_budget, room_s / per_token_s)))


@dataclass(frozen=True, slots=True)
class Job:
    """A request owed prefill, as the planner and the forecast see it: `deadline_s` is its
    arrival plus its TTFT target (infinite without one, or once it has its first token)."""

    key: str
    arrival_s: float
    deadline_s: float
    prefill_tokens: int
    needs_place: bool
    # Preempted after its first token, or partly prefilled: it holds (or held) KV and a place.
    resuming: bool

    @classmethod
    def of(cls, request: Request) -> Job:
        resuming = request.first_token_time is not None or request.num_computed_tokens > 0
        target = request.slo.ttft_ms
        deadline = (
            math.inf
            if target is None or request.first_token_time is not None
            else request.arrival_time + target / 1000
        )
        return cls(
            request.request_id,
            request.arrival_time,
            deadline,
            request.num_uncomputed_tokens,
            request.status is not RequestStatus.RUNNING,
            resuming,
        )


def riding_tokens(jobs: Iterable[Job], free_places: int) -> int:
    """The prefill that can fill the coming steps: that of the jobs holding a place, and of as
    many of the others, earliest deadline first, as there are places open. A step carries
    prefill only of requests in the batch, so while places are short the queue behind them
    does not make a step longer (counting it would set a short prompt aside as out of reach
    when it is one step from its first token)."""
    holding = 0
    seeking = []
    for job in jobs:
        if job.needs_place:
            seeking.append(job)
        else:
            holding += job.prefill_tokens
    admitted = sorted(seeking, key=_by_deadline)[: max(0, free_places)]
    return holding + sum(job.prefill_tokens for job in admitted)


def plan_order(jobs: Sequence[Job], pace: Pace, now: float) -> list[Job]:
    """The `slo` order of the jobs owed prefill: resuming jobs first, oldest first (they hold
    KV, or lost it once already); then the jobs still in reach of their deadline (served next,
    they would make it), earliest deadline first, which for one class with one target is
    arrival order; then those with no target; then those already beyond reach, oldest first
    (their SLO is lost; the starvation bound still serves them). Dropping the hopeless from
    the deadline order is what keeps it from collapsing in overload: no request is served
    ahead of one that can still make its deadline unless its own deadline comes first.
    """
    resuming = sorted((j for j in jobs if j.resuming), key=_by_arrival)
    fresh = sorted((j for j in jobs if not j.resuming), key=_by_deadline)
    ahead_tokens = sum(j.prefill_tokens for j in resuming)
    ahead_places = sum(j.needs_place for j in resuming)
    reachable, untargeted, beyond = [], [], []
    for job in fresh:
        if job.deadline_s == math.inf:
            untargeted.append(job)
        elif _alone_s(job, ahead_tokens, ahead_places, pace) <= job.deadline_s - now:
            reachable.append(job)
        else:
            beyond.append(job)
    return resuming + reachable + untargeted + sorted(beyond, key=_by_arrival)


def first_token_times(ordered: Sequence[Job], pace: Pace, now: float) -> dict[str, float]:
    """Predicted clock time of each job's first token when served in `ordered` order."""
    times = {}
    tokens = places = 0
    for job in ordered:
        tokens += job.prefill_tokens
        places += job.needs_place
        times[job.key] = now + pace.first_token_s(
            tokens, places, job.prefill_tokens, job.needs_place
        )
    return times


def _alone_s(job: Job, tokens: int, places: int, pace: Pace) -> float:
    """Seconds to the job's first token served right after the resuming jobs."""
    return pace.first_token_s(
        tokens + job.prefill_tokens, places + job.needs_place, job.prefill_tokens, job.needs_place
    )


def overdue(
    waiting: Iterable[Request], now: float, bound_s: float, full_step_s: float, full_tokens: int
) -> list[Request]:
    """The requests that must start now to get their first token within the starvation bound
    `bound_s`: what is left of their bound only just covers the prefill of every older request
    still owed a first token plus their own, at `full_tokens` per step of `full_step_s`
    (they are served oldest first). `waiting` is in arrival order."""
    earliest = now - BOUND_EARLIEST_SHARE * bound_s
    margin_s = BOUND_MARGIN_STEPS * full_step_s
    found = []
    tokens = 0
    for request in waiting:
        if request.arrival_time > earliest:
            break
        if request.first_token_time is not None:
            continue
        tokens += request.num_uncomputed_tokens
        need_s = -(-tokens // full_tokens) * full_step_s
        if now - request.arrival_time >= bound_s - need_s - margin_s:
            found.append(request)
    return found


def critical(
    request: Request,
    now: float,
    bound_s: float,
    full_step_s: float,
    full_tokens: int,
    tokens_ahead: int = 0,
) -> bool:
    """Whether an overdue request must be admitted this step, preempting if need be: what is
    left of its bound covers the prefill still owed by the overdue requests ahead of it
    (`tokens_ahead`, served first) and its own, plus one step, no more."""
    tokens = tokens_ahead + request.num_uncomputed_tokens
    need_s = -(-tokens // full_tokens) * full_step_s
    return now - request.arrival_time >= bound_s - need_s - full_step_s


def victim_rank(request: Request, cost: StepCost, now: float) -> tuple:
    """How little preempting a running request costs it against its own SLO, the largest the
    cheapest: its priority class (the least urgent first), then its slack left after
    recomputing what it has computed (TPOT pace banked, or TTFT deadline; infinite without a
    target), then the least work lost, then the latest arrival."""
    # Preempted, it recomputes all it has computed before its next token.
    recompute_s = request.num_computed_tokens * cost.prefill_token_s()
    if request.first_token_time is not None:
        target = request.slo.tpot_ms
        due_s = request.first_token_time + (target or 0) / 1000 * request.num_output_tokens
    else:
        target = request.slo.ttft_ms
        due_s = (
            request.arrival_time
            + (target or 0) / 1000
            - request.num_uncomputed_tokens * (cost.prefill_token_s())
        )
    slack_s = math.inf if target is None else due_s - now - recompute_s
    return (
        request.priority,
        slack_s,
        -request.num_computed_tokens,
        request.arrival_time,
        request.request_id,
    )


def _by_arrival(job: Job) -> tuple[float, str]:
    return job.arrival_s, job.key


def _by_deadline(job: Job) -> tuple[float, float, str]:
    return job.deadline_s, job.arrival_s, job.key
