"""`baton simulate --calibrate-from URL`: the simulator takes the step-cost model a running
server has fitted to its own steps, read from the server's `GET /v1/stats`."""

from __future__ import annotations

import json

import httpx
import pytest

from baton.app.cli import main
from baton.app.commands.calibration import served_coefficients
from baton.core.scheduling.step_cost import CostCoefficients, StepShape
from tests.server_harness import base_url, running_server, simulated_engine

KEY = "sk-calibrate"
TRUE_COST = CostCoefficients(
    base_s=0.012, per_prefill_token_s=4e-4, per_decode_token_s=9e-4, per_context_token_s=2e-6
)
SHAPES = [
    StepShape(64, 0, 64),
    StepShape(256, 0, 256),
    StepShape(0, 1, 64),
    StepShape(0, 8, 4096),
    StepShape(0, 16, 1024),
    StepShape(128, 4, 2176),
]


def teach(engine, rounds: int = 40) -> None:
    """Time steps as if each took exactly what TRUE_COST says: the online fit converges to it."""
    for _ in range(rounds):
        for shape in SHAPES:
            engine.step_cost_model.update(shape, TRUE_COST.predict(shape))


def test_stats_report_the_engines_step_cost_fit(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    teach(engine)
    with running_server(engine) as state:
        cost = httpx.get(f"{base_url(state)}/v1/stats").json()["step_cost"]
    assert cost["observations"] == 40 * len(SHAPES)
    assert cost["base_ms"] == pytest.approx(12.0, rel=0.02)
    assert cost["prefill_us_per_token"] == pytest.approx(400.0, rel=0.02)
    assert cost["decode_us_per_token"] == pytest.approx(900.0, rel=0.02)
    assert cost["context_ns_per_token"] == pytest.approx(2000.0, rel=0.02)
    assert 0 <= cost["mean_abs_error_ratio"] < 0.05


def test_simulate_takes_the_cost_model_from_a_running_server(llama_checkpoint, capsys):
    engine = simulated_engine(llama_checkpoint)
    teach(engine)
    with running_server(engine, api_keys=[KEY]) as state:
        url = base_url(state)
        served = engine.step_cost_model.current
        # Through /v1/stats' units (ms, µs, ns) and back: equal to the last bits of a float.
        fetched = served_coefficients(url, KEY).as_tuple()
        assert fetched == pytest.approx(served.as_tuple(), rel=1e-12)
        with pytest.raises(ValueError, match="HTTP 401"):
            served_coefficients(url)
        args = ["simulate", "--calibrate-from", url, "--api-key", KEY, "--rate", "2"]
        args += ["--num-requests", "20", "--length-scale", "0.05", "--policy", "slo", "--json"]
        assert main(args) == 0
    captured = capsys.readouterr()
    fitted = captured.err.split("calibrated: ")[1].split()[0]
    coefficients = {k: float(v) for k, v in (item.split("=") for item in fitted.split(","))}
    assert coefficients["base"] == pytest.approx(TRUE_COST.base_s, rel=0.02)
    assert coefficients["prefill"] == pytest.approx(TRUE_COST.per_prefill_token_s, rel=0.02)
    assert coefficients["decode"] == pytest.approx(TRUE_COST.per_decode_token_s, rel=0.02)
    assert coefficients["context"] == pytest.approx(TRUE_COST.per_context_token_s, rel=0.02)
    report = captured.out[captured.out.index("\n{") :]  # after the server's start-up line
    assert json.loads(report)["slo"]["num_requests"] == 20


def test_calibrate_from_a_server_that_has_not_stepped_is_a_clear_error(llama_checkpoint, capsys):
    with running_server(simulated_engine(llama_checkpoint)) as state:
        code = main(["simulate", "--calibrate-from", base_url(state), "--num-requests", "5"])
    assert code != 0
    assert "has not timed a step yet" in capsys.readouterr().err
