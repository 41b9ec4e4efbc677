"""The engine's step and finish listeners: what each step was made of, on the engine's clock."""

from __future__ import annotations

from baton.core.engine import Engine
from baton.core.request import FinishReason
from baton.core.scheduling.step_cost import CostCoefficients
from tests.factory import add_request, make_engine, make_request


def listened_engine() -> Engine:
    """Steps of 8 tokens, on a cost model without the context term: durations come out round."""
    return make_engine(
        num_kv_blocks=64,
        block_size=4,
        vocab_size=100,
        max_model_len=256,
        cost=CostCoefficients(0.01, 0.001, 0.001, per_context_token_s=0.0),
        max_num_batched_tokens=8,
        max_num_seqs=4,
    )


def test_step_stats_describe_each_batch_and_its_duration():
    engine = listened_engine()
    steps = []
    engine.step_listeners.append(steps.append)
    add_request(engine, make_request("long", list(range(1, 13)), max_tokens=2, ignore_eos=True))
    engine.step()  # 8 of the 12 prompt tokens
    add_request(engine, make_request("short", [5, 6], max_tokens=1, ignore_eos=True))
    engine.step()  # the last 4 prompt tokens of "long" and the 2 of "short"
    engine.step()  # one decode for "long"

    assert [(s.num_prefill_tokens, s.num_decode_tokens, s.num_seqs) for s in steps] == [
        (8, 0, 1),
        (6, 0, 2),
        (0, 1, 1),
    ]
    assert [s.num_context_tokens for s in steps] == [8, 12 + 2, 13]
    # The simulated executor advances the clock by its cost model; the stats see that time.
    assert [round(s.executed - s.started, 6) for s in steps] == [0.018, 0.016, 0.011]
    assert all(s.started <= s.executed <= s.finished for s in steps)


def test_finish_listener_sees_every_finished_request_once():
    engine = listened_engine()
    finished = []
    engine.finish_listeners.append(lambda request, output: finished.append(output))
    add_request(engine, make_request("a", [1, 2, 3], max_tokens=2, ignore_eos=True))
    add_request(engine, make_request("b", [4, 5, 6], max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort_request("b")
    while engine.has_unfinished_requests:
        engine.step()
    by_id = {output.request_id: output for output in finished}
    assert len(finished) == 2
    assert by_id["a"].finish_reason is FinishReason.LENGTH
    assert by_id["b"].finish_reason is FinishReason.CANCELLED
    assert by_id["a"].timing is not None and by_id["a"].timing.e2e_ms > 0
