"""The `slo` planner as a function of its view, over random small workloads (hypothesis): no
request waits past the starvation bound, the plan is the same for the same view, and the
admission forecast predicts exactly the first-token time the planner's order implies, with
places free and with a full batch."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from baton.core.request import SLO, FinishReason, Request, RequestStatus
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling import feasibility
from baton.core.scheduling.feasibility import Job
from baton.core.scheduling.lifetime import LifetimeMean
from baton.core.scheduling.policy import PolicyContext, SchedulerView
from baton.core.scheduling.policy_registry import make_policy
from baton.core.scheduling.step_cost import CostCoefficients, StepCostModel
from baton.core.scheduling.ttft_forecast import TTFTForecast
from tests.factory import add_request, make_engine, make_request

COST = CostCoefficients(
    base_s=0.005, per_prefill_token_s=1e-4, per_decode_token_s=2e-4, per_context_token_s=0.0
)
TARGETS = st.sampled_from([None, 100.0, 300.0, 1000.0, 5000.0])
SPEC = st.tuples(
    st.floats(0.0, 2.0),  # arrival
    st.integers(1, 600),  # prompt tokens
    st.integers(1, 40),  # max tokens
    TARGETS,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(SPEC, min_size=1, max_size=25),
    policy=st.sampled_from(["slo", "fcfs"]),
    factor=st.sampled_from([0.0, 3.0]),
)
# Found by hypothesis: two overdue requests waiting for places, the younger critical only once
# the older one's prefill is counted ahead of it (it passed the bound by 2 ms)...
@example(
    specs=[
        *([(0.0, 1, 1, None)] * 8),
        *[(0.0, 1, 27, None), (0.0, 330, 8, None), (0.0, 8, 38, 5000.0), (0.0, 7, 40, None)],
        *[(0.0, 103, 40, None), (1 / 256, 262, 22, None), (1 / 256, 171, 1, None)],
    ],
    policy="slo",
    factor=0.0,
)
# ...and an overdue request on its last prompt token, scheduled as a decode and again from the
# overdue order in the same step (its output processed twice: KeyError).
@example(
    specs=[
        *([(0.0, 1, 1, None)] * 8),
        *[(0.0, 1, 27, None), (0.0, 329, 9, None), (0.0, 8, 38, 5000.0), (0.0, 7, 40, None)],
        *[(0.0, 103, 40, 5000.0), (1 / 256, 279, 18, None), (1 / 256, 154, 1, None)],
    ],
    policy="slo",
    factor=0.0,
)
# ...and a burst at one instant owing more prefill than the bound can carry beside the batch's
# decodes: the last of it is late under any order, by less than the burst's prefill time.
@example(
    specs=[
        *([(0.0, 1, 1, None)] * 3),
        *[(0.0, 83, 40, 5000.0), (0.0, 361, 40, 5000.0), (0.0, 472, 40, 5000.0)],
        *[(0.0, 588, 2, 5000.0), (0.0, 194, 1, 5000.0), (0.0, 175, 40, 5000.0)],
        *[(0.0, 171, 37, None), (0.0, 169, 40, 5000.0)],
    ],
    policy="fcfs",
    factor=3.0,
)
def test_no_request_waits_past_the_bound(specs, policy, factor):
    bound_ms = 300.0
    engine = make_engine(
        num_kv_blocks=128,
        cost=COST,
        scheduling_policy=policy,
        max_wait_ms=bound_ms,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        slo_admission_factor=factor,
    )
    pending = sorted(enumerate(specs), key=lambda item: item[1][0])
    done = []
    engine.finish_listeners.append(lambda request, _: done.append(request))
    while pending or engine.has_unfinished_requests:
        while pending and pending[0][1][0] <= engine.clock():
            index, (arrival, prompt_len, max_tokens, ttft_ms) = pending.pop(0)
            add_request(
                engine,
                make_request(
                    f"r{index}",
                    [1 + index % 50] * prompt_len,
                    max_tokens=max_tokens,
                    slo=SLO(ttft_ms, None),
                    arrival_time=arrival,
                ),
            )
        if not engine.has_unfinished_requests:
            engine.clock.now = pending[0][1][0]
            continue
        engine.step()
    assert len(done) == len(specs)
    # Its prefill alone may take a few steps at the whole budget; the bound leaves room for them.
    longest_step_s = COST.predict_step(256, 4, 0)
    arrivals = [(arrival, prompt_len) for arrival, prompt_len, _, _ in specs]
    for request in done:
        if request.finish_reason is FinishReason.REFUSED:
            # SLO admission control refused it at the first step past factor × its target,
            # before it ever started: it waited no longer than that, nor than the bound.
            assert policy == "slo" and factor > 0 and request.first_scheduled_time is None
            waited_s = request.finish_time - request.arrival_time
            assert factor * request.slo.ttft_ms / 1000 < waited_s <= bound_ms / 1000
            assert waited_s <= factor * request.slo.ttft_ms / 1000 + longest_step_s
            continue
        # The bound is a promise where it can be kept. A burst owing more prefill within one
        # bound than half of it can carry (beside a full batch's decodes) defeats any order:
        # there the first token may be late by at most the time that burst's prefill takes.
        burst = sum(
            n
            for a, n in arrivals
            if request.arrival_time - bound_ms / 1000 <= a <= request.arrival_time
        )
        burst_s = -(-burst // (256 - 4)) * longest_step_s
        late_s = burst_s if burst_s > bound_ms / 2000 else 0.0
        # Up to float rounding: the simulated clock sums step times.
        assert request.first_token_time - request.arrival_time <= bound_ms / 1000 + late_s + 1e-9
        assert request.num_preemptions <= 3


def waiting_request(index: int, arrival: float, prompt_len: int, ttft_ms: float | None) -> Request:
    return Request(
        f"w{index}", [1] * prompt_len, SamplingParams(max_tokens=8), arrival, 0, SLO(ttft_ms)
    )


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(SPEC, min_size=1, max_size=30), now=st.floats(2.0, 3.0))
def test_the_plan_is_a_function_of_the_view(specs, now):
    policy = make_policy("slo", PolicyContext(StepCostModel(COST), max_num_seqs=8))
    queue = tuple(waiting_request(i, a, n, t) for i, (a, n, _, t) in enumerate(specs))
    view = SchedulerView(now, queue, (), 2048)
    first = policy.plan(view)
    policy.plan(SchedulerView(now + 1.0, queue[::-1], (), 512))  # another step in between
    again = make_policy("slo", PolicyContext(StepCostModel(COST), max_num_seqs=8)).plan(view)
    assert first == policy.plan(view) == again
    assert sorted(r.request_id for r in first.order) == sorted(r.request_id for r in queue)


def decoding_request(index: int, prompt_len: int) -> Request:
    """A running request past its first token, owed one decode."""
    request = Request(f"d{index}", [1] * prompt_len, SamplingParams(max_tokens=64), 0.0, 0, SLO())
    request.append_token(1)
    request.num_computed_tokens = prompt_len
    request.status = RequestStatus.RUNNING
    request.first_token_time = 0.5
    return request


@settings(max_examples=80, deadline=None)
@given(
    specs=st.lists(SPEC, min_size=0, max_size=30),
    prompt_len=st.integers(1, 3000),
    ttft_ms=TARGETS,
    num_running=st.integers(0, 64),
    lifetime_s=st.floats(0.0, 10.0),
)
def test_the_forecast_is_the_planners_first_token_time(
    specs, prompt_len, ttft_ms, num_running, lifetime_s
):
    """With the cost model exact (it charges no context, which the forecast's ledger does not
    track), the forecast for a newcomer is the time the planner's own order (including the
    newcomer, set aside after everything in reach if it is out of reach) gives it, capped at
    the starvation bound: with places free and with a batch of up to 64 running decodes, where
    a place frees every mean lifetime / batch size."""
    now = 2.0
    cost = StepCostModel(COST)
    forecast = TTFTForecast(cost, 2048, max_num_seqs=64, max_wait_s=20.0)
    forecast.lifetime_s = lifetime_s
    running = tuple(decoding_request(i, 100 + i) for i in range(num_running))
    for request in running:
        forecast.add(request.request_id, request.num_prompt_tokens, SLO(), now=0.0)
        forecast.first_token(request.request_id, now=0.5)
    queue = []
    for i, (arrival, n, _, target) in enumerate(specs):
        forecast.add(f"w{i}", n, SLO(target, None), now=arrival)
        queue.append(waiting_request(i, arrival, n, target))
    predicted = forecast.predict(prompt_len, ttft_ms, now)

    newcomer = Request(
        "\U0010ffff", [1] * prompt_len, SamplingParams(max_tokens=8), now, 0, SLO(ttft_ms)
    )
    lifetime = LifetimeMean()
    lifetime.add(lifetime_s)
    context = PolicyContext(cost, max_num_seqs=64, lifetime=lifetime)
    policy = make_policy("slo", context)
    view = SchedulerView(now, (*queue, newcomer), running, 2048 - num_running)
    plan = policy.plan(view)
    jobs = [Job.of(r) for r in plan.order]
    pace = policy.pace(view, plan.prefill_budget, jobs)
    planned_s = feasibility.first_token_times(jobs, pace, now)[newcomer.request_id] - now
    assert math.isclose(predicted.ttft_s, min(planned_s, 20.0), rel_tol=1e-12)
