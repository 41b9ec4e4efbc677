"""The scheduler's hard bounds on a simulated clock, under every policy: no request waits longer
than `--max-wait-ms` for its first token, even behind a batch full of long generations, and no
request is preempted more than `--max-preemptions` times."""

from __future__ import annotations

import pytest

from baton.core.config import POLICIES
from baton.core.request import SLO
from baton.core.simulation.records import summarize
from baton.core.simulation.simulator import SimulationConfig, simulate
from baton.core.simulation.workloads import CHAT, LONG_GENERATION, WorkloadRequest, sample_requests
from tests.factory import add_request, make_engine, make_request


def full_batch_of_long_generations() -> list[WorkloadRequest]:
    """64 long generations (2,048 tokens each, about 50 s of decoding) fill the batch at 0; a
    chat request arrives every second for 30 s."""
    batch = [WorkloadRequest(0.0, 64, 2048, 2048, LONG_GENERATION) for _ in range(64)]
    chats = [WorkloadRequest(0.5 + i, 64, 64, 512, CHAT) for i in range(30)]
    return batch + chats


@pytest.mark.parametrize("policy", ["slo", "fcfs", "sjf"])
def test_a_batch_full_of_long_generations_holds_no_chat_past_the_bound(policy):
    config = SimulationConfig()
    result = simulate(policy, full_batch_of_long_generations(), config)
    bound_ms = config.engine.max_wait_ms
    chats = [r for r in result.records if r.class_name == "interactive"]
    assert len(chats) == 30
    assert max(r.ttft_ms for r in chats) <= bound_ms
    assert summarize(result.records)["ttft_max_ms"] <= bound_ms
    assert result.num_preemptions > 0  # the bound took places from the long generations


def test_a_small_kv_pool_preempts_no_request_more_than_the_limit():
    workload = sample_requests("mixed", 300, 6.0, seed=0)
    for policy in ("slo", "fcfs", "sjf"):
        result = simulate(policy, workload, SimulationConfig(num_kv_blocks=600))
        assert result.num_preemptions > 0
        assert max(r.num_preemptions for r in result.records) <= 3


# Static batching reserves each request's whole length up front and never preempts
# (tests/test_static_batch.py).
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "static"])
def test_a_request_preempted_max_preemptions_times_is_protected(policy):
    engine = make_engine(
        num_kv_blocks=16, block_size=4, scheduling_policy=policy, max_preemptions=1
    )
    for i in range(4):
        add_request(engine, make_request(f"r{i}", [1 + i] * 10, max_tokens=20, slo=SLO(None, 50)))
    seen: dict[str, int] = {}
    steps = 0
    while engine.has_unfinished_requests and steps < 2000:
        engine.step()
        steps += 1
        for request in engine.scheduler.requests.values():
            seen[request.request_id] = request.num_preemptions
    assert not engine.has_unfinished_requests
    assert engine.scheduler.num_preemptions > 0
    assert max(seen.values()) <= 1
