"""Room to grow (core/scheduling/kv_growth.py): under `slo` a prompt waits while the running
requests, grown to their predicted lengths, would not leave it room in the KV pool; the peak
forecast agrees with a step-by-step count; vLLM's ordering (`fcfs`) admits it and preempts."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from baton.core.engine import Engine
from baton.core.request import RequestStatus
from baton.core.scheduling.kv_growth import MIN_OBSERVATIONS, peak_blocks
from tests.factory import add_request, make_engine, make_request

BLOCK_SIZE = 16
PROMPT = 64  # 4 blocks
ANSWER = 96  # a request ends at 160 tokens: 10 blocks
# Two requests at full length fit (20 blocks), three do not (30).
NUM_BLOCKS = 24


def counted_peak(tokens, remaining, block_size, window_blocks):
    """Step by step: every request alive at step t holds its blocks at n + t tokens."""
    peak = 0
    for step in range(max(remaining, default=0) + 1):
        held = 0
        for n, g in zip(tokens, remaining, strict=True):
            if step <= g:
                blocks = -(-(n + step) // block_size)
                held += blocks if window_blocks is None else min(blocks, window_blocks)
        peak = max(peak, held)
    return peak


@settings(max_examples=300, deadline=None)
@given(
    members=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=12),
    block_size=st.sampled_from([1, 4, 16]),
    window_blocks=st.one_of(st.none(), st.integers(1, 8)),
)
def test_peak_blocks_matches_a_step_by_step_count(members, block_size, window_blocks):
    tokens = [n for n, _ in members]
    remaining = [g for _, g in members]
    expected = counted_peak(tokens, remaining, block_size, window_blocks)
    assert peak_blocks(tokens, remaining, block_size, window_blocks) == expected


def warmed_engine(policy: str, observations: int = MIN_OBSERVATIONS, **config) -> Engine:
    """An engine whose length predictor has seen `observations` answers run to max_tokens,
    so it predicts every answer runs to max_tokens; `config` are more EngineConfig fields."""
    engine = make_engine(
        num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, scheduling_policy=policy, **config
    )
    for i in range(observations):
        add_request(engine, make_request(f"warm{i}", [i + 1] * 8, max_tokens=4))
    while engine.has_unfinished_requests:
        engine.step()
    assert engine.length_predictor.num_observations == observations
    return engine


def start_three(engine: Engine) -> list:
    requests = [
        add_request(engine, make_request(f"r{i}", [100 + i] * PROMPT, max_tokens=ANSWER))
        for i in range(3)
    ]
    engine.step()
    return requests


def finish(engine: Engine) -> None:
    for _ in range(10_000):
        if not engine.has_unfinished_requests:
            return
        engine.step()
    raise AssertionError("requests did not finish")


def test_slo_holds_a_prompt_back_until_the_running_requests_leave_it_room():
    engine = warmed_engine("slo")
    requests = start_three(engine)
    assert [r.status for r in requests] == [
        RequestStatus.RUNNING,
        RequestStatus.RUNNING,
        RequestStatus.WAITING,
    ]
    # Counted once a step it held the prompt back, for /metrics and /v1/stats.
    assert engine.make_stats().num_kv_growth_holds == 1
    finish(engine)
    assert engine.make_stats().num_kv_growth_holds > 1
    assert all(r.num_output_tokens == ANSWER for r in requests)
    assert engine.scheduler.num_preemptions == 0


def test_a_shared_prefix_counts_once():
    # Three blocks of each prompt are one cached prefix, held once: all three fit at full
    # length (3 + 3 x 7 = 24 blocks), though three whole requests (3 x 10) would not.
    engine = warmed_engine("slo")
    shared = [7] * (3 * BLOCK_SIZE)
    requests = [
        add_request(
            engine,
            make_request(f"r{i}", shared + [100 + i] * (PROMPT - len(shared)), max_tokens=ANSWER),
        )
        for i in range(3)
    ]
    engine.step()  # the first computes the prefix; the others read it from the cache next
    engine.step()
    assert all(r.status is RequestStatus.RUNNING for r in requests)
    finish(engine)
    assert all(r.num_output_tokens == ANSWER for r in requests)
    assert engine.scheduler.num_preemptions == 0


def test_fcfs_admits_the_prompt_and_preempts_when_the_pool_runs_out():
    engine = warmed_engine("fcfs")
    requests = start_three(engine)
    assert all(r.status is RequestStatus.RUNNING for r in requests)
    finish(engine)
    assert all(r.num_output_tokens == ANSWER for r in requests)
    assert engine.scheduler.num_preemptions > 0


def test_the_forecast_can_be_turned_off():
    engine = warmed_engine("slo", kv_growth_forecast=False)
    requests = start_three(engine)
    assert all(r.status is RequestStatus.RUNNING for r in requests)
    assert engine.make_stats().num_kv_growth_holds == 0


def test_a_cold_predictor_holds_nothing_back():
    # Before it has seen enough answers the predictor says every answer runs to max_tokens,
    # whatever it is, and the check would starve a server whose clients leave it unset.
    engine = warmed_engine("slo", observations=MIN_OBSERVATIONS - 1)
    requests = start_three(engine)
    assert all(r.status is RequestStatus.RUNNING for r in requests)


def test_an_overdue_prompt_starts_without_room():
    engine = make_engine(
        num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, scheduling_policy="slo", max_wait_ms=50
    )
    for i in range(MIN_OBSERVATIONS):
        add_request(engine, make_request(f"warm{i}", [i + 1] * 8, max_tokens=4))
    finish(engine)
    requests = start_three(engine)
    assert requests[2].status is RequestStatus.WAITING
    # Past the starvation bound it starts, though the forecast says there is no room.
    for _ in range(1_000):
        if requests[2].status is RequestStatus.RUNNING or not engine.has_unfinished_requests:
            break
        engine.step()
    assert requests[2].status is RequestStatus.RUNNING
    assert requests[0].status is RequestStatus.RUNNING and requests[0].num_output_tokens < ANSWER
