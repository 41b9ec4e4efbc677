"""Scheduling policies: each step the scheduler hands one a read-only view of the queues and
the clock and gets back a plan (the order to serve prefill in, how much prefill the step
carries); it also asks whom to preempt when KV blocks run out. Budgets, blocks, preemption
mechanics and the hard bounds stay in the scheduler. A policy keeps no state between steps.

The baselines live here: `fcfs`, `priority`, `static`, and the length-aware orderings the
literature compares against, `sjf`, `hrrn` (Magnus) and `ltr` (learning to rank). The `slo`
policy is in core/scheduling/slo_policy.py; core/scheduling/policy_registry.py names them all.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from baton.core.request import Request
from baton.core.scheduling.length_predictor import LengthPredictor
from baton.core.scheduling.lifetime import LifetimeMean
from baton.core.scheduling.step_cost import StepCostModel

UNLIMITED = sys.maxsize


@dataclass(slots=True)
class PolicyContext:
    """What a policy may consult besides the queues: the step-cost model, the output-length
    predictor and the mean request lifetime (all learning online in the engine), the
    starvation bound, the scheduler's budgets (tokens per step, sequences in the batch) and
    SLO admission control's factor (a request with a TTFT target starts within it times its
    target, or is refused)."""

    cost_model: StepCostModel = field(default_factory=StepCostModel)
    length_predictor: LengthPredictor = field(default_factory=LengthPredictor)
    max_wait_s: float = 20.0
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = UNLIMITED
    lifetime: LifetimeMean = field(default_factory=LifetimeMean)
    slo_admission_factor: float = 0.0


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """What a policy sees of one step: the requests owed prefill (`waiting`: waiting,
    preempted and partly prefilled), the batch (`running`), the token budget left after the
    running decodes, and the clock. Policies must not change the requests."""

    now: float
    waiting: tuple[Request, ...]
    running: tuple[Request, ...]
    token_budget: int


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A policy's answer: requests owed prefill in the order the step serves them (a waiting
    request left out is held back this step), the prefill tokens the step may carry, and the
    budget a chunk uses per token of KV before it (its attention reads them), in prefill
    tokens."""

    order: list[Request]
    prefill_budget: int
    context_weight: float = 0.0


class SchedulingPolicy(ABC):
    name: str
    # Static (request-level) batching instead of continuous: the scheduler then reserves each
    # admitted request's maximum length of KV, lets no request past the starvation bound into
    # a running batch and charges its padding (core/scheduling/static_batch.py).
    static_batching: bool = False
    # A prompt starts only if the running requests and it still fit the KV pool as they grow
    # to their predicted lengths (core/scheduling/kv_growth.py); off, a prompt starts whenever
    # its next chunk fits, as in vLLM.
    leaves_kv_growth_room: bool = False

    def __init__(self, context: PolicyContext | None = None) -> None:
        self.context = context or PolicyContext()

    def plan(self, view: SchedulerView) -> StepPlan:
        """The step's plan; the order is worked out only when some prefill fits."""
        budget = self.prefill_budget(view)
        order = self.order_waiting(view.waiting, view.now) if budget > 0 and view.waiting else []
        return StepPlan(order, budget)

    @abstractmethod
    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        """Requests still owed prefill (waiting, preempted, partly prefilled) in the order the
        step should serve them; a waiting request left out is held back this step."""

    def prefill_budget(self, view: SchedulerView) -> int:
        """Prefill tokens this step may carry."""
        return view.token_budget

    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        """The running request to preempt when KV blocks run out: the latest arrival."""
        return max(candidates, key=_arrival)

    def refuse(self, waiting: Sequence[Request], now: float) -> list[Request]:
        """Queued requests to refuse now instead of serving them (none, but under `slo`)."""
        return []


class FCFSPolicy(SchedulingPolicy):
    """First come, first served: admit in arrival order, preempt the latest arrival."""

    name = "fcfs"

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=_arrival)


class StaticPolicy(FCFSPolicy):
    """Static batching, the baseline continuous batching is measured against: a batch forms from
    the head of the queue only once the previous one has ended, up to `max_num_seqs` requests or
    as many as the KV pool holds at their maximum length, its prompts prefill whole, and nothing
    joins it until its longest member ends. The policy says who forms a batch and when; the
    scheduler reserves the KV and charges the padding (`static_batching`)."""

    name = "static"
    static_batching = True

    def prefill_budget(self, view: SchedulerView) -> int:
        # Finished members leave `running`, so it empties exactly when the longest one ends.
        return 0 if view.running else UNLIMITED


class PriorityPolicy(SchedulingPolicy):
    """Static priority classes (a lower `priority` value goes first), FCFS within a class;
    the victim is the latest arrival of the lowest class."""

    name = "priority"

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=lambda r: (r.priority, r.arrival_time, r.request_id))

    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        return max(candidates, key=lambda r: (r.priority, r.arrival_time, r.request_id))


class SJFPolicy(SchedulingPolicy):
    """Shortest job first on what is known for sure: the prompt still to prefill."""

    name = "sjf"

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=lambda r: (r.num_uncomputed_tokens, *_arrival(r)))


class HRRNPolicy(SchedulingPolicy):
    """Highest response ratio next, as in Magnus: (wait + predicted service) / predicted
    service, where service is the prefill plus the predicted output length at the current
    decode pace. Short jobs go first, and a long one's ratio grows as it waits, so none starves.
    """

    name = "hrrn"

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        def ratio(request: Request) -> tuple[float, float, str]:
            service = predicted_service_s(self.context, request)
            response = (now - request.arrival_time + service) / service
            return -response, *_arrival(request)

        return sorted(waiting, key=ratio)


class LTRPolicy(SchedulingPolicy):
    """Learning to rank: shortest predicted output first, by the online length predictor;
    only the relative order of the predictions matters."""

    name = "ltr"

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        predict = self.context.length_predictor.predict
        return sorted(waiting, key=lambda r: (predict(r), *_arrival(r)))


def predicted_service_s(context: PolicyContext, request: Request) -> float:
    """Seconds of engine time `request` still needs: its prefill at the marginal token cost
    plus its predicted remaining output at the pace of a one-sequence decode step."""
    cost = context.cost_model
    prefill_s = request.num_uncomputed_tokens * cost.prefill_token_s()
    remaining = max(1.0, context.length_predictor.predict(request) - request.num_output_tokens)
    decode_s = cost.predict_step(0, 1, request.num_tokens)
    return max(1e-6, prefill_s + remaining * decode_s)


def _arrival(request: Request) -> tuple[float, str]:
    return request.arrival_time, request.request_id
