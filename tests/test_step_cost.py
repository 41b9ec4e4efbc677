"""The step-cost model: its fit recovers known coefficients, follows a drift, keeps every
coefficient non-negative, stays sane off a load that never varies some feature, and reports its
error; the engine refits it to every step, and the simulated executor charges each step what
its coefficients give."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import random
from pathlib import Path

import pytest

from baton.core.batch import Batch
from baton.core.scheduling.step_cost import (
    NUM_FEATURES,
    CostCoefficients,
    StepCostModel,
    StepShape,
    anchored_nnls,
)
from baton.core.scheduling.step_cost_profile import profile_shapes, warm_up
from baton.core.simulation.simulated_executor import SimulatedClock, SimulatedExecutor
from baton.core.simulation.simulator import DEFAULT_COST
from baton.core.structured_output import GuideKind, StructuredOutput
from tests.factory import add_request, make_engine, make_request

TRUE = CostCoefficients(0.008, 6e-5, 3e-4, 2e-7)
DATA = Path(__file__).parent / "data"


def random_shapes(count: int, seed: int = 0) -> list[StepShape]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        decodes = rng.randint(0, 64)
        prefill = rng.choice([0, 0, rng.randint(1, 2048)])
        context = decodes * rng.randint(10, 2000) + prefill
        shapes.append(StepShape(prefill, decodes, context))
    return [shape for shape in shapes if shape.num_prefill_tokens or shape.num_decode_tokens]


def test_fit_recovers_known_coefficients():
    model = StepCostModel()
    for shape in random_shapes(300):
        model.update(shape, TRUE.predict(shape))
    for fitted, true in zip(model.coefficients, TRUE.as_tuple(), strict=True):
        assert fitted == pytest.approx(true, rel=1e-3)
    assert model.last_error_ratio < 1e-3
    assert model.mean_abs_error_ratio < 0.05


def test_fit_follows_a_machine_that_slows_down():
    model = StepCostModel()
    for shape in random_shapes(200, seed=1):
        model.update(shape, TRUE.predict(shape))
    slower = CostCoefficients(*(2 * c for c in TRUE.as_tuple()))
    for shape in random_shapes(600, seed=2):
        model.update(shape, slower.predict(shape))
    probe = StepShape(512, 32, 32 * 500 + 512)
    assert model.predict(probe) == pytest.approx(slower.predict(probe), rel=0.02)


def test_coefficients_never_go_negative_under_noise():
    model = StepCostModel()
    rng = random.Random(3)
    for shape in random_shapes(300, seed=4):
        model.update(shape, TRUE.predict(shape) * rng.uniform(0.5, 1.5))
        assert min(model.coefficients) >= 0.0


def test_a_long_chat_run_keeps_the_fit_sane_off_its_own_shapes():
    # 14,024 steps recorded from a simulated chat-only run (decodes and context move together,
    # 5% noise). The fit must keep predicting a decode step near the truth all along: recursive
    # least squares without the anchor winds up in the direction such traffic never varies and,
    # clipped at zero, predicts many times the true time.
    model = StepCostModel()
    warm_up(model, DEFAULT_COST.predict, profile_shapes(2048, 64, 8192))
    probe = StepShape(0, 36, 36 * 180)
    worst = 1.0
    with gzip.open(DATA / "chat_steps.csv.gz", "rt") as steps:
        for line in steps:
            if line.startswith("#"):
                continue
            prefill, decode, context, micros = map(int, line.split(","))
            model.update(StepShape(prefill, decode, context), micros / 1e6)
            ratio = model.predict(probe) / DEFAULT_COST.predict(probe)
            worst = max(worst, ratio, 1 / ratio)
    assert worst < 1.1


def test_engine_fits_its_model_to_every_step():
    engine = make_engine(num_kv_blocks=512, vocab_size=1000, max_model_len=4096, cost=TRUE)
    rng = random.Random(6)
    for i in range(40):
        tokens = [rng.randrange(1000) for _ in range(rng.randint(1, 600))]
        add_request(engine, make_request(f"r{i}", tokens, max_tokens=rng.randint(1, 60)))
    while engine.has_unfinished_requests:
        engine.step()
    model = engine.step_cost_model
    assert model.num_observations == engine.num_steps
    assert model.last_error_ratio < 0.01
    probe = StepShape(256, 16, 16 * 300 + 256)
    assert model.predict(probe) == pytest.approx(TRUE.predict(probe), rel=0.05)


def test_simulated_executor_charges_the_true_cost_with_bounded_noise():
    batches: list[Batch] = []
    clock = SimulatedClock()
    engine = make_engine(
        num_kv_blocks=64,
        vocab_size=1000,
        max_model_len=1024,
        cost=TRUE,
        on_batch=batches.append,
        clock=clock,
    )
    noisy = SimulatedExecutor(64, 16, 1000, cost=TRUE, noise=0.1, seed=7)
    add_request(engine, make_request("r", list(range(300)), max_tokens=3))
    while engine.has_unfinished_requests:
        engine.step()
    assert [StepShape.of_batch(batch) for batch in batches] == [
        StepShape(300, 0, 300),
        StepShape(0, 1, 301),
        StepShape(0, 1, 302),
    ]
    assert clock.now == pytest.approx(sum(TRUE.predict(StepShape.of_batch(b)) for b in batches))
    durations = []
    for batch in batches * 50:
        before = noisy.clock.now
        noisy.execute(batch)
        durations.append((noisy.clock.now - before) / TRUE.predict(StepShape.of_batch(batch)))
    assert 0.9 <= min(durations) < 0.93 and 1.07 < max(durations) <= 1.1


def test_coefficients_parse_from_the_command_line_form():
    parsed = CostCoefficients.parse("base=0.01, prefill=1e-4,context=2e-7")
    assert parsed.base_s == 0.01
    assert parsed.per_prefill_token_s == 1e-4
    assert parsed.per_context_token_s == 2e-7
    with pytest.raises(ValueError, match="NAME=SECONDS"):
        CostCoefficients.parse("speed=3")
    with pytest.raises(ValueError, match=">= 0"):
        CostCoefficients.parse("base=-1")


@pytest.mark.parametrize("seed", range(40))
def test_a_warm_started_fit_finds_the_same_optimum_whatever_support_it_tries_first(seed):
    rng = random.Random(seed)
    n = NUM_FEATURES
    rows = [[rng.gauss(0, 1) for _ in range(n)] for _ in range(2 * n)]
    gram = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    # Targets of either sign, so the optimum has zeros on some seeds and none on others.
    moment = [rng.gauss(0, 3) for _ in range(n)]
    anchor = [rng.uniform(0, 1) for _ in range(n)]
    cold = anchored_nnls(gram, moment, anchor, 0.5)

    assert min(cold) >= 0
    for size in range(n + 1):
        for hint in itertools.combinations(range(n), size):
            assert anchored_nnls(gram, moment, anchor, 0.5, hint) == pytest.approx(cold)


def test_fit_learns_what_a_row_sampled_under_a_grammar_costs():
    true = CostCoefficients(0.008, 6e-5, 3e-4, 2e-7, per_constrained_row_s=4e-4)
    rng = random.Random(7)
    model = StepCostModel()
    for shape in random_shapes(300, seed=3):
        constrained = rng.randint(0, shape.num_decode_tokens)
        shape = dataclasses.replace(shape, num_constrained_rows=constrained)
        model.update(shape, true.predict(shape))
    for fitted, expected in zip(model.coefficients, true.as_tuple(), strict=True):
        assert fitted == pytest.approx(expected, rel=1e-3)
    assert model.predict_step(0, 16, 4000, 16) - model.predict_step(0, 16, 4000) == pytest.approx(
        16 * 4e-4, rel=1e-3
    )


def test_engine_counts_constrained_rows_and_its_fit_prices_them():
    # Half the requests sample under a (pre-compiled) grammar; the simulated machine charges
    # each such row: the engine's steps say how many, and its fit finds what one costs.
    true = CostCoefficients(0.008, 6e-5, 3e-4, 2e-7, per_constrained_row_s=5e-4)
    rows = []
    engine = make_engine(
        num_kv_blocks=512, cost=true, on_batch=lambda b: rows.append(b.num_constrained_rows)
    )
    digits = StructuredOutput(GuideKind.REGEX, "[0-9]+").compiled(object())
    rng = random.Random(8)
    for i in range(40):
        tokens = [rng.randrange(1000) for _ in range(rng.randint(1, 300))]
        constraint = {"structured_output": digits} if i % 2 else {}
        request = make_request(f"r{i}", tokens, max_tokens=rng.randint(4, 60), **constraint)
        add_request(engine, request)
    while engine.has_unfinished_requests:
        engine.step()
    assert max(rows) > 0 and min(rows) == 0
    fitted = engine.step_cost_model.current.per_constrained_row_s
    assert fitted == pytest.approx(5e-4, rel=0.05)
