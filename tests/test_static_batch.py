"""Static batching as the `static` policy models it, on a simulated clock with the model-free
executor: KV reserved for each slot's maximum length (so fewer fit, and nothing is preempted),
a closed batch that runs until its longest member ends, every step charged the padded batch,
the same tokens as continuous batching, and a throughput that falls behind continuous
batching's with the spread of the output lengths and the looseness of `max_tokens`."""

from __future__ import annotations

import dataclasses
import math

import pytest

from baton.core.batch import Batch
from baton.core.engine import Engine
from baton.core.scheduling.step_cost import CostCoefficients, StepShape
from baton.core.simulation.records import summarize
from baton.core.simulation.simulator import SimulationConfig, simulate
from baton.core.simulation.workloads import cap_max_tokens, sample_requests
from tests.factory import add_request, make_engine, make_request


def run(engine: Engine) -> tuple[dict[str, list[int]], list[Batch]]:
    """Every request's output tokens and every batch the engine ran, to completion."""
    batches: list[Batch] = []
    engine.executor.on_batch = batches.append
    tokens: dict[str, list[int]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests:
            return tokens, batches
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    raise AssertionError("requests did not finish")


def test_a_static_batch_reserves_each_slots_maximum_length_so_fewer_fit():
    # Prompt 16 + max_tokens 64 = 5 blocks of 16 a slot: 20 blocks hold 4 of the 8 places.
    engines = {
        policy: make_engine(
            num_kv_blocks=20, max_num_seqs=8, scheduling_policy=policy, enable_prefix_caching=False
        )
        for policy in ("static", "fcfs")
    }
    for engine in engines.values():
        for i in range(6):
            add_request(engine, make_request(f"r{i}", [1 + i] * 16, max_tokens=64))
    static = engines["static"]
    first = static.scheduler.schedule(0.0)
    assert [seq.request_id for seq in first.sequences] == ["r0", "r1", "r2", "r3"]
    assert static.kv_cache.pool.num_free_blocks == 0
    # Continuous batching takes blocks as the answers grow: all six start, one block each.
    continuous = engines["fcfs"].scheduler.schedule(0.0)
    assert len(continuous.sequences) == 6
    assert engines["fcfs"].kv_cache.pool.num_free_blocks == 14


def test_static_batching_never_preempts_where_continuous_batching_must():
    # Each request reaches 30 tokens, 8 blocks of 4: two fit in the pool at their longest.
    members = {}
    preemptions = {}
    for policy in ("static", "fcfs"):
        engine = make_engine(num_kv_blocks=16, block_size=4, scheduling_policy=policy)
        for i in range(4):
            add_request(engine, make_request(f"r{i}", [1 + i] * 10, max_tokens=20))
        _tokens, batches = run(engine)
        members[policy] = [sorted(seq.request_id for seq in b.sequences) for b in batches]
        preemptions[policy] = engine.scheduler.num_preemptions
    assert preemptions["static"] == 0 and preemptions["fcfs"] > 0
    # Two batches of two, each run whole before the next forms.
    assert members["static"] == [["r0", "r1"]] * 20 + [["r2", "r3"]] * 20


def test_each_step_of_a_static_batch_costs_the_padded_batch_until_its_longest_member_ends():
    cost = CostCoefficients()
    engine = make_engine(scheduling_policy="static", cost=cost, enable_prefix_caching=False)
    for name, prompt_len, max_tokens in (("a", 10, 2), ("b", 20, 5), ("c", 40, 3)):
        add_request(engine, make_request(name, [7] * prompt_len, max_tokens=max_tokens))
    _tokens, batches = run(engine)
    assert [len(batch.sequences) for batch in batches] == [3, 3, 2, 1, 1]
    # Three rows throughout: prompts padded to 40, and every row decodes (and reads 40 + k
    # positions) at decode step k, whether its member has finished or not.
    shapes = [StepShape.of_batch(batch) for batch in batches]
    assert shapes == [
        StepShape(120, 0, 120),
        StepShape(0, 3, 123),
        StepShape(0, 3, 126),
        StepShape(0, 3, 129),
        StepShape(0, 3, 132),
    ]
    assert batches[0].padding.num_prefill_tokens == 120 - (10 + 20 + 40)
    # The simulated executor charged each step its padded shape.
    assert engine.clock.now == pytest.approx(sum(cost.predict(shape) for shape in shapes))


def test_a_static_batch_is_closed_even_to_a_request_past_the_starvation_bound():
    engine = make_engine(scheduling_policy="static", max_wait_ms=1.0)
    member = add_request(engine, make_request("member", [3] * 8, max_tokens=40))
    engine.step()
    late = add_request(engine, make_request("late", [4] * 8, max_tokens=2))
    run(engine)
    assert late.first_scheduled_time >= member.finish_time
    assert late.first_scheduled_time - late.arrival_time > 0.001
    assert engine.scheduler.num_preemptions == 0


def test_static_batching_pads_the_cost_but_not_the_tokens():
    # Prompts of 3 to 58 tokens and answers of 2 to 17: two batches, padded unevenly.
    requests = [
        (f"r{i}", [(5 * i + j) % 97 + 1 for j in range(3 + 11 * i)], 2 + 3 * i) for i in range(6)
    ]
    outputs = {}
    for policy in ("fcfs", "static"):
        engine = make_engine(
            scheduling_policy=policy, max_num_seqs=4, num_kv_blocks=24, max_num_batched_tokens=32
        )
        for request_id, prompt, max_tokens in requests:
            add_request(engine, make_request(request_id, prompt, max_tokens=max_tokens))
        outputs[policy], batches = run(engine)
        padded = [b for b in batches if b.padding.num_decode_tokens or b.padding.num_prefill_tokens]
        assert bool(padded) == (policy == "static")
    assert outputs["static"] == outputs["fcfs"]
    assert [len(outputs["static"][r]) for r, _, _ in requests] == [2, 5, 8, 11, 14, 17]


def backlog_throughput(workload: str, max_tokens: str, policy: str) -> float:
    """Requests per simulated second with every request queued at once (no starvation bound:
    the backlog would pass it, and its preemptions would measure the bound)."""
    requests = cap_max_tokens(sample_requests(workload, 128, math.inf, seed=0), max_tokens)
    config = SimulationConfig()
    config.engine = dataclasses.replace(config.engine, max_wait_ms=math.inf)
    return summarize(simulate(policy, requests, config).records)["throughput_rps"]


def test_static_batching_loses_by_the_spread_of_output_lengths_and_a_loose_max_tokens():
    def ratio(workload: str, max_tokens: str) -> float:
        fcfs = backlog_throughput(workload, max_tokens, "fcfs")
        return fcfs / backlog_throughput(workload, max_tokens, "static")

    # Equal lengths and a cap that fits: a static batch wastes nothing.
    assert ratio("fixed", "exact") == pytest.approx(1.0, abs=0.1)
    # The same lengths, each slot reserving 4,096 tokens: fewer fit.
    assert ratio("fixed", "4096") > 1.4
    # A long tail: every batch waits for its longest member.
    assert ratio("long-tail", "exact") > 3
