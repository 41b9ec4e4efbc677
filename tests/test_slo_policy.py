"""The `slo` policy on a simulated clock with an exact step-cost model: a short request jumps a
long-prompt flood, the starvation bound holds under a flood of urgent requests, prefill chunks
keep running decodes within their TPOT target, and victims are chosen by priority and slack."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest

from baton.core.batch import Batch
from baton.core.config import POLICIES
from baton.core.engine import Engine
from baton.core.request import SLO, EngineRequest, FinishReason, Request, RequestStatus
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.policy import PolicyContext, SchedulerView
from baton.core.scheduling.policy_registry import make_policy
from baton.core.scheduling.slo_policy import SLOPolicy
from baton.core.scheduling.step_cost import CostCoefficients, StepCostModel, StepShape
from baton.core.scheduling.step_cost_profile import profile_shapes, warm_up
from baton.core.structured_output import GuideKind, StructuredOutput
from tests.factory import add_request, make_engine

VOCAB = 1000
TRUE = CostCoefficients(
    base_s=0.005, per_prefill_token_s=1e-4, per_decode_token_s=2e-4, per_context_token_s=1e-7
)


def shape_of(batch: Batch) -> StepShape:
    context = sum(seq.seq_len for seq in batch.sequences)
    return StepShape(batch.num_prefill_tokens, batch.num_decode_tokens, context)


@dataclass
class Arrival:
    time: float
    request_id: str
    prompt_len: int
    max_tokens: int
    slo: SLO
    priority: int = 0


def warmed_engine(policy: str, num_kv_blocks: int = 8192, **config) -> Engine:
    """An engine on the TRUE cost whose step-cost model already knows it exactly."""
    engine = make_engine(
        num_kv_blocks=num_kv_blocks,
        vocab_size=VOCAB,
        max_model_len=8192,
        cost=TRUE,
        scheduling_policy=policy,
        enable_prefix_caching=False,
        **config,
    )
    # The exact model, as the warm-up profile would fit it on this "machine".
    warm_up(engine.step_cost_model, TRUE.predict, profile_shapes(2048, 64, 8192))
    return engine


def run(engine: Engine, arrivals: list[Arrival]) -> dict[str, Request]:
    finished: dict[str, Request] = {}
    engine.finish_listeners.append(
        lambda request, _: finished.setdefault(request.request_id, request)
    )
    pending = sorted(arrivals, key=lambda a: a.time)
    rng = random.Random(0)
    while pending or engine.has_unfinished_requests:
        while pending and pending[0].time <= engine.clock():
            a = pending.pop(0)
            tokens = [rng.randrange(VOCAB) for _ in range(a.prompt_len)]
            add_request(
                engine,
                EngineRequest(
                    a.request_id,
                    tokens,
                    SamplingParams(max_tokens=a.max_tokens),
                    priority=a.priority,
                    slo=a.slo,
                    arrival_time=a.time,
                ),
            )
        if not engine.has_unfinished_requests:
            engine.clock.now = pending[0].time
            continue
        engine.step()
    return finished


def ttft(request: Request) -> float:
    return request.first_token_time - request.arrival_time


def long_prompt_flood() -> list[Arrival]:
    flood = [Arrival(0.0, f"rag-{i}", 1500, 8, SLO(30_000, None)) for i in range(20)]
    return [*flood, Arrival(0.05, "chat", 20, 8, SLO(500, None))]


def test_short_request_behind_a_long_prompt_flood_meets_ttft_under_slo():
    done = run(warmed_engine("slo"), long_prompt_flood())
    assert ttft(done["chat"]) <= 0.5
    assert all(ttft(done[f"rag-{i}"]) <= 30 for i in range(20))


def test_short_request_behind_a_long_prompt_flood_misses_ttft_under_fcfs():
    done = run(warmed_engine("fcfs"), long_prompt_flood())
    assert ttft(done["chat"]) > 2.0


def urgent_flood() -> list[Arrival]:
    # Urgent 200-token prompts at ~95% of what 256-token steps can prefill, for 8 s, and three
    # batch requests whose far deadline always loses to theirs.
    urgent = [Arrival(i * 0.025, f"urgent-{i}", 200, 1, SLO(300, None)) for i in range(320)]
    batch = [Arrival(0.1 * (i + 1), f"batch-{i}", 1000, 4, SLO(60_000, None), 1) for i in range(3)]
    return urgent + batch


def test_no_request_waits_past_the_starvation_bound_under_an_urgent_flood():
    # Admission control off: the bound must hold for every request the server accepted.
    engine = warmed_engine(
        "slo", max_num_batched_tokens=256, max_wait_ms=2000, slo_admission_factor=0
    )
    done = run(engine, urgent_flood())
    assert len(done) == 323
    assert max(ttft(r) for r in done.values()) <= 2.0
    # The urgent stream is still served within its own target almost always.
    urgent = [r for r in done.values() if r.request_id.startswith("urgent")]
    assert sum(ttft(r) <= 0.3 for r in urgent) >= 0.95 * len(urgent)


def test_without_the_bound_the_urgent_flood_starves_batch_requests():
    # Proves the test above pins the aging: with an effectively infinite bound it fails.
    engine = warmed_engine(
        "slo", max_num_batched_tokens=256, max_wait_ms=1e9, slo_admission_factor=0
    )
    done = run(engine, urgent_flood())
    assert max(ttft(r) for r in done.values()) > 2.0


def tpot_workload() -> list[Arrival]:
    chats = [Arrival(0.0, f"chat-{i}", 50, 40, SLO(None, 40)) for i in range(8)]
    longs = [Arrival(0.1 + 0.05 * i, f"long-{i}", 3000, 4, SLO(None, None)) for i in range(10)]
    return chats + longs


def chat_tpots_and_steps(policy: str) -> tuple[list[float], list[float]]:
    """Each chat request's time per output token (first token to last over the tokens between)
    and the predicted (= true) duration of every step that carried one of their decodes."""
    durations = []

    def record(batch: Batch) -> None:
        if any(
            seq.request_id.startswith("chat")
            and len(seq.token_ids) == 1
            and seq.start_position >= seq.num_prompt_tokens
            for seq in batch.sequences
        ):
            durations.append(TRUE.predict(shape_of(batch)))

    done = run(warmed_engine(policy, on_batch=record, max_wait_ms=1e9), tpot_workload())
    tpots = [
        (r.token_times[-1] - r.token_times[0]) / (r.num_output_tokens - 1)
        for r in done.values()
        if r.request_id.startswith("chat")
    ]
    return tpots, durations


def test_prefill_chunks_keep_running_decodes_within_their_tpot_target():
    # A TPOT target is a per-token average, so the invariant is on it: with an exact model
    # (and exact lengths: no EOS here) every decode ends within its target. Single steps may
    # be longer than the target, paid for by the decode's banked slack and remaining tokens.
    tpots, durations = chat_tpots_and_steps("slo")
    assert len(tpots) == 8 and max(tpots) <= 0.040 + 1e-9
    assert len(durations) >= 39 and max(durations) > 0.040


def test_fcfs_chunks_break_the_tpot_of_running_decodes():
    tpots, durations = chat_tpots_and_steps("fcfs")
    assert max(durations) > 0.1
    assert max(tpots) > 0.040


def test_tightest_target_wins_and_no_target_means_no_cap():
    policy = make_policy("slo", PolicyContext(max_num_batched_tokens=2048))
    loose = decoding("a", SLO(None, 200))
    tight = decoding("b", SLO(None, 20))
    free = decoding("c", SLO(None, None))
    assert policy.prefill_budget(SchedulerView(0.0, (), (free,), 2047)) == 2047
    budget_loose = policy.prefill_budget(SchedulerView(0.0, (), (loose, free), 2046))
    budget_tight = policy.prefill_budget(SchedulerView(0.0, (), (loose, tight, free), 2045))
    assert 0 < budget_tight < budget_loose


def decoding(
    request_id: str,
    slo: SLO,
    arrival: float = 0.0,
    priority: int = 0,
    max_tokens: int = 50,
    first_token_time: float | None = None,
) -> Request:
    """A request of 10 prompt tokens, prefilled, with its first output token (at
    `first_token_time`, by default 0.1 s after arrival)."""
    params = SamplingParams(max_tokens=max_tokens)
    request = Request(request_id, [1] * 10, params, arrival, priority, slo)
    request.append_token(2)
    request.num_computed_tokens = 10
    request.first_token_time = arrival + 0.1 if first_token_time is None else first_token_time
    return request


def test_victim_is_lowest_priority_then_most_slack_then_latest_arrival():
    policy = make_policy("slo")
    high = decoding("high", SLO(None, None), arrival=5.0, priority=0)
    low_tight = decoding("low-tight", SLO(None, 10), arrival=1.0, priority=1)
    low_loose = decoding("low-loose", SLO(None, 1000), arrival=0.5, priority=1)
    assert policy.choose_victim([high, low_tight, low_loose], 1.0).request_id == "low-loose"
    early = decoding("early", SLO(None, 50), arrival=0.0, priority=1)
    late = decoding("late", SLO(None, 50), arrival=0.0, priority=1)
    late.arrival_time = 0.5
    late.first_token_time = early.first_token_time  # same pace, same slack
    assert policy.choose_victim([early, late, high], 1.0).request_id == "late"


def test_requests_that_cannot_make_their_deadline_go_after_those_that_can():
    policy = make_policy("slo", PolicyContext(max_num_batched_tokens=2048))
    hopeless = Request("hopeless", [1] * 4000, SamplingParams(max_tokens=4), 0.0, 0, SLO(50, None))
    # The step that serves `tight` carries a full budget of the others' prefill (~0.21 s).
    tight = Request("tight", [1] * 10, SamplingParams(max_tokens=4), 0.0, 0, SLO(300, None))
    loose = Request("loose", [1] * 10, SamplingParams(max_tokens=4), 0.0, 0, SLO(5000, None))
    untargeted = Request("none", [1] * 10, SamplingParams(max_tokens=4), 0.0, 0, SLO())
    order = policy.plan(SchedulerView(0.0, (untargeted, hopeless, loose, tight), (), 2048)).order
    assert [r.request_id for r in order] == ["tight", "loose", "none", "hopeless"]


def waiting(request_id: str, prompt_len: int, ttft_ms: float, arrival: float = 0.0) -> Request:
    return Request(
        request_id, [1] * prompt_len, SamplingParams(max_tokens=4), arrival, 0, SLO(ttft_ms)
    )


def order_of(policy: SLOPolicy, queue: list[Request], now: float = 0.0) -> list[str]:
    plan = policy.plan(SchedulerView(now, tuple(queue), (), 2048))
    return [r.request_id for r in plan.order]


def test_one_class_with_one_target_is_served_in_arrival_order():
    policy = make_policy("slo", PolicyContext(max_num_batched_tokens=2048))
    queue = [waiting(f"r{i}", 50 + (i * 397) % 900, 500, arrival=i * 0.01) for i in range(8)]
    assert order_of(policy, list(reversed(queue)), now=0.1) == [f"r{i}" for i in range(8)]


def test_with_one_place_open_a_short_prompt_is_in_reach_of_its_deadline():
    # One place open in a batch of two: only one waiting prompt can join the next step, so the
    # short one, due in 50 ms, is one ~15 ms step from its first token (two 1,500-token RAG
    # prompts behind it cannot fill that step: they have no place).
    context = PolicyContext(StepCostModel(TRUE), max_num_batched_tokens=2048, max_num_seqs=2)
    policy = make_policy("slo", context)
    decoding = Request("decoding", [1] * 10, SamplingParams(max_tokens=8), 0.0, 0, SLO())
    decoding.append_token(1)
    decoding.num_computed_tokens = 10
    decoding.status = RequestStatus.RUNNING
    decoding.first_token_time = 0.1
    queue = (waiting("rag0", 1500, 5000), waiting("rag1", 1500, 5000), waiting("short", 95, 500))
    plan = policy.plan(SchedulerView(0.45, queue, (decoding,), 2047))
    assert [r.request_id for r in plan.order] == ["short", "rag0", "rag1"]


def test_in_overload_the_hopeless_go_after_every_request_in_reach():
    # Four 2,000-token prompts due in 0.5 s cannot all make it (about 0.2 s each), and one
    # of 30,000 tokens cannot make 0.4 s at all: the ones in reach keep deadline order, the
    # hopeless one goes last instead of first.
    policy = make_policy("slo", PolicyContext(max_num_batched_tokens=2048))
    queue = [waiting(f"long{i}", 2000, 500) for i in range(4)]
    queue += [waiting("short", 100, 600), waiting("hopeless", 30_000, 400)]
    assert order_of(policy, queue) == ["long0", "long1", "long2", "long3", "short", "hopeless"]


def test_the_plan_depends_on_the_view_alone():
    policy = make_policy("slo", PolicyContext(max_num_batched_tokens=2048))
    queue = [waiting(f"r{i}", 100 + 300 * i, 400 + 100 * i) for i in range(6)]
    first = order_of(policy, queue)
    order_of(policy, [waiting("other", 5000, 100)], now=3.0)
    assert order_of(policy, queue) == first


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_serves_a_mixed_load_to_completion_with_the_same_outputs(policy):
    arrivals = [
        Arrival(
            0.01 * i,
            f"r{i}",
            30 + (i * 37) % 700,
            5 + (i * 11) % 40,
            SLO(300 if i % 3 else None, 50 if i % 2 else None),
            i % 2,
        )
        for i in range(60)
    ]
    reference = run(warmed_engine("fcfs"), arrivals)
    # A small cache forces preemptions, so the victim choice is exercised too; static batching
    # reserves each request's whole length up front and never preempts.
    engine = warmed_engine(policy, num_kv_blocks=64)
    done = run(engine, arrivals)
    assert (engine.scheduler.num_preemptions > 0) == (policy != "static")
    served = {k: r for k, r in done.items() if r.finish_reason is not FinishReason.REFUSED}
    assert {k: r.token_ids for k, r in served.items()} == {
        k: reference[k].token_ids for k in served
    }
    # Under `slo`, admission control may refuse a request that waited past 3× its TTFT target
    # without starting (this load is a heavy overload); nothing else is refused.
    assert len(done) == len(arrivals)
    for request in done.values():
        if request.finish_reason is FinishReason.REFUSED:
            assert policy == "slo" and request.first_scheduled_time is None
            assert request.slo.ttft_ms is not None
            assert request.finish_time - request.arrival_time > 3 * request.slo.ttft_ms / 1000


def test_tpot_allowance_is_the_banked_slack_alone():
    policy = make_policy("slo", PolicyContext(max_num_batched_tokens=2048))
    request = decoding("a", SLO(None, 20))  # first token at 0.1 s, 1 token so far, max 50
    # The second token is due 20 ms after the first; 10 ms of it are gone. Nothing is lent
    # against the 48 tokens it may still make: it could end at the next one.
    assert policy.tpot_allowance_s(request, 0.11) == pytest.approx(0.01)
    # Tokens made faster than the target bank the difference.
    for _ in range(48):
        request.append_token(2)
    assert request.num_output_tokens == 49
    assert policy.tpot_allowance_s(request, 0.5) == pytest.approx(0.1 + 0.02 * 49 - 0.5)
    # Behind its pace, it can absorb nothing.
    assert policy.tpot_allowance_s(request, 1.2) < 0


def test_a_decode_under_a_grammar_leaves_less_room_for_prefill_when_masks_cost():
    cost = StepCostModel(CostCoefficients(0.005, 1e-4, 2e-4, 1e-7, per_constrained_row_s=2e-3))
    policy = make_policy("slo", PolicyContext(cost, max_num_batched_tokens=2048))
    plain = decoding("a", SLO(None, 40))
    constrained = decoding("b", SLO(None, 40))
    digits = StructuredOutput(GuideKind.REGEX, "[0-9]+")
    params = dataclasses.replace(plain.sampling_params, structured_output=digits)
    constrained.sampling_params = params
    budget_plain = policy.prefill_budget(SchedulerView(0.0, (), (plain,), 2047))
    budget_constrained = policy.prefill_budget(SchedulerView(0.0, (), (constrained,), 2047))
    # The mask's 2 ms is 20 prefill tokens' worth of the step's room.
    assert budget_plain - budget_constrained == pytest.approx(2e-3 / (1e-4 + 1e-7), abs=1)
