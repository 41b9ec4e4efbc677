"""The mean request lifetime (first token to finish) the engine learns and publishes, which the
`slo` planner and admission's forecast turn into the wait for a place in a full batch."""

from __future__ import annotations

import pytest

from baton.core.scheduling.lifetime import LIFETIME_EMA_WEIGHT, LifetimeMean
from baton.core.scheduling.step_cost import CostCoefficients
from tests.factory import add_request, make_engine, make_request


def test_the_first_lifetime_is_the_mean_and_later_ones_move_it_by_the_weight():
    lifetime = LifetimeMean()
    lifetime.add(0.0)  # a one-token answer: first token and finish in the same step
    assert lifetime.mean_s == 0.0 and lifetime.num_observations == 1
    lifetime.add(2.0)
    assert lifetime.mean_s == pytest.approx(LIFETIME_EMA_WEIGHT * 2.0)


def test_the_engine_publishes_the_mean_lifetime_of_finished_requests():
    # Steps of 10 ms: a request with 5 output tokens lives 4 steps after its first token.
    engine = make_engine(cost=CostCoefficients(0.01, 0.0, 0.0, 0.0))
    add_request(engine, make_request("a", [1] * 8, max_tokens=5))
    while engine.has_unfinished_requests:
        engine.step()
    assert engine.make_stats().mean_lifetime_s == pytest.approx(0.04)
    add_request(engine, make_request("b", [2] * 8, max_tokens=3))
    engine.abort_request("b")  # never started: it held no place for a decode
    assert engine.lifetime.num_observations == 1
