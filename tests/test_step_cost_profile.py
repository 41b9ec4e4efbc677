"""The warm-up profile: its synthetic step shapes alone fit the step-cost model, and on an
executor they run within its KV cache and leave no error of their own behind."""

from __future__ import annotations

import random

import pytest

from baton.core.batch import Batch
from baton.core.scheduling.step_cost import CostCoefficients, StepCostModel, StepShape
from baton.core.scheduling.step_cost_profile import profile_executor, profile_shapes, warm_up
from baton.core.simulation.simulated_executor import SimulatedClock, SimulatedExecutor

TRUE = CostCoefficients(0.008, 6e-5, 3e-4, 2e-7)


def random_shapes(count: int, seed: int) -> list[StepShape]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        decodes = rng.randint(0, 64)
        prefill = rng.choice([0, 0, rng.randint(1, 2048)])
        if decodes or prefill:
            shapes.append(StepShape(prefill, decodes, decodes * rng.randint(10, 2000) + prefill))
    return shapes


def test_warm_up_profile_alone_predicts_within_ten_percent():
    model = StepCostModel(CostCoefficients(0.05, 1e-5, 1e-3, 0.0))
    warm_up(model, TRUE.predict, profile_shapes(2048, 64, 4096))
    for shape in random_shapes(50, seed=5):
        assert model.predict(shape) == pytest.approx(TRUE.predict(shape), rel=0.1)


def test_executor_profile_runs_synthetic_steps_within_the_cache():
    clock = SimulatedClock()
    seen: list[Batch] = []
    executor = SimulatedExecutor(32, 16, 1000, clock, TRUE, on_batch=seen.append)
    model = StepCostModel()
    profile_executor(model, executor, 2048, 64, 512, 1000, clock=clock)
    assert model.num_observations > 0
    # The fit's own errors are not reported: the metrics show the error on real steps.
    assert model.last_error_ratio is None and model.mean_abs_error_ratio is None
    probe = StepShape(100, 8, 8 * 200 + 100)
    assert model.predict(probe) == pytest.approx(TRUE.predict(probe), rel=0.05)
    for batch in seen:
        for seq in batch.sequences:
            assert all(0 <= block < 32 for block in seq.block_table)
            assert seq.seq_len <= 511
            assert len(seq.block_table) * 16 >= seq.seq_len
