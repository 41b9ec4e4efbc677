"""The `slo` policy: a stateless planner. From the scheduler's read-only view it returns the
step's plan: prefill in core/scheduling/feasibility.py's `plan_order` (earliest deadline first among
the requests still in reach, the hopeless after them) and a prefill budget that keeps running
decodes within their TPOT targets (derivation: docs/architecture.md, Scheduling)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from baton.core.request import Request
from baton.core.scheduling import feasibility
from baton.core.scheduling.feasibility import Job, Pace
from baton.core.scheduling.policy import SchedulerView, SchedulingPolicy, StepPlan

# When even a decode-only step misses the tightest TPOT target, prefill keeps this much per
# step: the target cannot be met either way, and the queue must not freeze.
MIN_PREFILL_TOKENS = 16
# The TPOT cap shrinks by the step-cost model's mean relative error, up to this much.
MAX_ERROR_HEADROOM = 0.25


class SLOPolicy(SchedulingPolicy):
    name = "slo"
    leaves_kv_growth_room = True

    def plan(self, view: SchedulerView) -> StepPlan:
        capped, context_weight = self.prefill_budget_and_weight(view)
        if capped <= 0 or not view.waiting:
            return StepPlan([], capped, context_weight)
        waiting = self.order_waiting(view.waiting, view.now)
        jobs = [Job.of(request) for request in waiting]
        budget = capped
        pace = self.pace(view, budget, jobs)
        ordered = feasibility.plan_order(jobs, pace, view.now)
        if capped < view.token_budget:
            # The cap buys attainment only if it keeps more decodes on pace than it makes
            # waiting requests miss their first-token deadline.
            full_pace = self.pace(view, view.token_budget, jobs)
            full_order = feasibility.plan_order(jobs, full_pace, view.now)
            gained = _on_time(full_order, full_pace, view.now) - _on_time(ordered, pace, view.now)
            if gained > self.decodes_at_risk(view, view.token_budget):
                budget, ordered, context_weight = view.token_budget, full_order, 0.0
        by_id = {request.request_id: request for request in waiting}
        return StepPlan([by_id[job.key] for job in ordered], budget, context_weight)

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        """Earliest TTFT deadline first (arrival order within one target); the planner then
        moves what feasibility asks for."""
        return sorted(waiting, key=lambda r: (Job.of(r).deadline_s, r.arrival_time, r.request_id))

    def pace(self, view: SchedulerView, budget: int, jobs: Sequence[Job]) -> Pace:
        """How fast the queue moves under this plan: `budget` prefill tokens per step on top of
        the running decodes, and once the batch is full one place freeing every mean request
        lifetime / batch size (renewal: the remaining tokens of the requests running now would
        mislead, since one past its predicted length looks about to finish while it is as
        likely as not to go on)."""
        decoding = [r for r in view.running if r.num_uncomputed_tokens == 1]
        free_places = self.context.max_num_seqs - len(view.running)
        return feasibility.pace_of(
            self.context.cost_model,
            min(budget, self.context.max_num_batched_tokens),
            len(decoding),
            sum(r.num_tokens for r in decoding),
            free_places,
            self.context.lifetime.mean_s,
            self.context.max_num_seqs,
            feasibility.riding_tokens(jobs, free_places),
        )

    def prefill_budget_and_weight(self, view: SchedulerView) -> tuple[int, float]:
        """The step's prefill budget under the TPOT cap, and the budget a chunk uses per token
        of KV before it (its attention reads them) while the cap holds."""
        cost = self.context.cost_model
        num_decodes = num_context = num_constrained = 0
        targeted = []
        for request in view.running:
            if request.num_uncomputed_tokens == 1:
                num_decodes += 1
                num_context += request.num_tokens
                num_constrained += request.sampling_params.structured_output is not None
                if request.slo.tpot_ms is not None:
                    targeted.append(request)
        decode_s = cost.predict_step(0, num_decodes, num_context, num_constrained)
        per_token_s = cost.prefill_token_s()
        if not targeted:
            return view.token_budget, 0.0
        # Leave room for the model's usual error, so a typical step lands within target.
        error = self.error_headroom()
        # A decode already too far behind its pace to keep its target is not worth a cap.
        allowances = [
            allowance
            for request in targeted
            if (allowance := self.tpot_allowance_s(request, view.now)) >= decode_s * (1 + error)
        ]
        if not allowances:
            return view.token_budget, 0.0
        tightest_s = min(allowances)
        room_s = tightest_s / (1 + error) - decode_s
        if room_s <= 0:
            budget = min(view.token_budget, MIN_PREFILL_TOKENS)
        elif per_token_s > 0:
            # Compared as floats first: a loose target over a tiny cost overflows to inf.
            budget = int(min(view.token_budget, room_s / per_token_s))
        else:
            budget = view.token_budget
        context_s = cost.predict_step(0, 0, 1) - cost.predict_step(0, 0, 0)
        return budget, (context_s / per_token_s if per_token_s > 0 else 0.0)

    def prefill_budget(self, view: SchedulerView) -> int:
        return self.prefill_budget_and_weight(view)[0]

    def error_headroom(self) -> float:
        cost = self.context.cost_model
        return min(MAX_ERROR_HEADROOM, getattr(cost, "mean_abs_error_ratio", None) or 0.0)

    def decodes_at_risk(self, view: SchedulerView, num_prefill: int) -> int:
        """Decodes that a step carrying `num_prefill` tokens would push off their TPOT target
        while a decode-only step would not."""
        cost = self.context.cost_model
        decoding = [r for r in view.running if r.num_uncomputed_tokens == 1]
        context = sum(r.num_tokens for r in decoding)
        constrained = sum(r.sampling_params.structured_output is not None for r in decoding)
        error = self.error_headroom()
        decode_s = cost.predict_step(0, len(decoding), context, constrained) * (1 + error)
        step_s = cost.predict_step(num_prefill, len(decoding), context + num_prefill, constrained)
        step_s *= 1 + error
        at_risk = 0
        for request in decoding:
            if request.slo.tpot_ms is not None:
                allowance = self.tpot_allowance_s(request, view.now)
                at_risk += decode_s <= allowance < step_s
        return at_risk

    def tpot_allowance_s(self, request: Request, now: float) -> float:
        """The longest step starting at `now` that the decoding request can absorb and still end
        within its TPOT target, whenever it ends: its banked slack (first token time + target ×
        tokens so far − now; the next token is `num_output_tokens` intervals after the first).
        Nothing is lent against the tokens it is predicted to make yet: one that ends before
        its predicted length would never repay it. One with a single prompt token left to
        prefill gets one target. A request prefilled on another engine is paced from its
        landing here (`pace_start_time`): counted from its first token it arrives already
        behind, by the transfer, and would never be protected from prefill."""
        target_s = request.slo.tpot_ms / 1000
        if request.first_token_time is None:
            return target_s
        start = request.pace_start_time
        if start is None:
            start = request.first_token_time
        return start + target_s * request.num_output_tokens - now

    def refuse(self, waiting: Sequence[Request], now: float) -> list[Request]:
        """SLO admission control's second half: a request that has waited longer than the
        factor times its TTFT target without being scheduled is refused, as it would have been
        at arrival had the forecast seen this coming. In overload, serving it late would take
        the place of a request that can still be on time, which then misses too."""
        factor = self.context.slo_admission_factor
        if factor <= 0:
            return []
        return [
            request
            for request in waiting
            if request.first_scheduled_time is None
            and request.slo.ttft_ms is not None
            and now - request.arrival_time > factor * request.slo.ttft_ms / 1000
        ]

    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        """The running request whose preemption costs least against its own SLO."""
        cost = self.context.cost_model
        return max(candidates, key=lambda r: feasibility.victim_rank(r, cost, now))


def _on_time(ordered: list[Job], pace: Pace, now: float) -> int:
    """How many of the jobs with a deadline get their first token by it in this order."""
    times = feasibility.first_token_times(ordered, pace, now)
    return sum(times[job.key] <= job.deadline_s for job in ordered if job.deadline_s < math.inf)
