"""The engine's own timestamps (token times, prefill chunks, preemption and resumption) and the
plain-Python aggregates built from them, on a simulated clock."""

from __future__ import annotations

from baton.core.batch import Batch, ScheduledSequence
from baton.core.engine import Engine
from baton.core.metrics.metric_aggregates import EngineMetrics, Histogram, token_gaps
from baton.core.request import SLO
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.simulation.simulated_executor import SimulatedClock
from tests.factory import add_request, make_engine, make_request


def timed_engine(clock: SimulatedClock, num_kv_blocks: int = 64, **config) -> Engine:
    """Small blocks, on a cost model without the context term: durations come out round."""
    return make_engine(
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        vocab_size=100,
        max_model_len=256,
        cost=CostCoefficients(0.01, 0.001, 0.001, per_context_token_s=0.0),
        clock=clock,
        **config,
    )


def run(engine: Engine) -> None:
    while engine.has_unfinished_requests:
        engine.step()


def test_each_output_token_and_prefill_chunk_is_timed_when_its_step_finished():
    clock = SimulatedClock()
    engine = timed_engine(clock, max_num_batched_tokens=8)
    finished = []
    engine.finish_listeners.append(lambda request, output: finished.append(request))
    add_request(engine, make_request("r", list(range(1, 21)), max_tokens=4, ignore_eos=True))
    run(engine)
    [request] = finished
    # 20 prompt tokens in chunks of 8, 8 and 4; the last chunk also samples the first token.
    assert [chunk[2] for chunk in request.prefill_chunks] == [8, 8, 4]
    starts = [chunk[0] for chunk in request.prefill_chunks]
    ends = [chunk[1] for chunk in request.prefill_chunks]
    assert starts == sorted(starts) and all(s < e for s, e in zip(starts, ends, strict=True))
    assert len(request.token_times) == 4
    assert request.token_times[0] == request.first_token_time == ends[-1]
    assert request.token_times[-1] == request.finish_time
    # Each decode step costs 0.01 + 0.001 s on the simulated executor.
    assert [round(gap, 6) for gap in token_gaps(request.token_times)] == [0.011] * 3


def test_only_prefill_chunks_are_timed_not_decodes_drafts_or_a_resumed_requests_last_token():
    params = SamplingParams(max_tokens=4)

    def chunk(request_id: str, start: int, num_tokens: int, num_prompt: int) -> ScheduledSequence:
        tokens = list(range(start + num_tokens))
        return ScheduledSequence(
            request_id, tokens[start:], start, [0], True, params, tokens, num_prompt
        )

    drafted = chunk("drafted", 10, 3, 8)
    drafted.draft_token_ids = [1, 2]
    sequences = [
        chunk("decode", 9, 1, 8),
        drafted,
        chunk("first", 0, 8, 20),
        # Resumed with all but its last token cached: one token past its prompt, a decode.
        chunk("resumed", 12, 1, 8),
        chunk("last", 16, 4, 20),
    ]
    batch = Batch(sequences, num_prefill_tokens=12, num_decode_tokens=3, num_draft_tokens=2)
    assert [seq.request_id for seq in batch.prefill_chunks()] == ["last", "first"]


def test_preemption_and_resumption_times_are_recorded():
    clock = SimulatedClock()
    # Without prefix caching the whole sequence is computed again after resuming.
    engine = timed_engine(
        clock, num_kv_blocks=6, max_num_batched_tokens=64, enable_prefix_caching=False
    )
    finished = {}
    engine.finish_listeners.append(
        lambda request, output: finished.update({request.request_id: request})
    )
    for name in "ab":
        add_request(engine, make_request(name, [7] * 8, max_tokens=12, ignore_eos=True))
    run(engine)
    preempted = [r for r in finished.values() if r.num_preemptions]
    assert preempted
    request = preempted[0]
    assert len(request.preempted_times) == len(request.resumed_times) == request.num_preemptions
    assert request.preempted_times[0] <= request.resumed_times[0] <= request.finish_time
    # The recompute after resuming is a prefill chunk of prompt and output so far.
    assert any(start >= request.resumed_times[0] for start, _, _ in request.prefill_chunks)
    assert len(request.token_times) == 12


def test_aggregates_count_tokens_slo_outcomes_and_keep_a_sliding_window():
    clock = SimulatedClock()
    engine = timed_engine(clock, max_num_batched_tokens=64)
    metrics = EngineMetrics(window_s=1.0)
    metrics.attach(engine)
    params = {"max_tokens": 5, "ignore_eos": True}
    add_request(
        engine, make_request("met", [1, 2, 3], slo=SLO(ttft_ms=1000.0, tpot_ms=1000.0), **params)
    )
    add_request(engine, make_request("missed", [4, 5, 6], slo=SLO(ttft_ms=0.001), **params))
    run(engine)
    assert (metrics.totals.requests, metrics.totals.generation_tokens) == (2, 10)
    assert metrics.slo_attained == {"ttft": 1, "tpot": 1}
    assert metrics.slo_missed == {"ttft": 1, "tpot": 0}
    assert metrics.itl.count == 8 and metrics.ttft.count == 2
    requests, steps = metrics.window()
    # Both finish in the same step, in the policy's order: compare regardless of it.
    assert sorted(r.slo_met for r in requests) == [False, True]
    assert len(steps) == engine.num_steps == metrics.step_duration.count
    clock.now += 5.0  # past the window: the snapshot is empty, the totals stay
    assert metrics.window() == ([], [])
    assert metrics.totals.requests == 2


def test_histogram_buckets_are_upper_bounds():
    histogram = Histogram([0.1, 1.0])
    histogram.observe_many([0.05, 0.1, 0.5, 3.0])
    assert histogram.cumulative() == [2, 3, 4]
    assert histogram.count == 4 and histogram.sum == 3.65
