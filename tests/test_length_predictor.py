"""The output-length predictor learns per prompt/max_tokens bucket from finished requests,
ignores cancelled ones and reports its error."""

from __future__ import annotations

import random

import pytest

from baton.core.request import FinishReason
from baton.core.scheduling.length_predictor import LengthPredictor
from tests.factory import make_core_request


def finished(prompt_len: int, max_tokens: int, output_len: int, reason=FinishReason.STOP):
    request = make_core_request("r", [1] * prompt_len, max_tokens=max_tokens)
    request.token_ids.extend([2] * output_len)
    request.finish_reason = reason
    return request


def test_untrained_predictor_assumes_max_tokens():
    assert LengthPredictor().predict_length(100, 256) == 256


def test_predictor_learns_different_lengths_per_bucket():
    predictor = LengthPredictor()
    rng = random.Random(0)
    for _ in range(200):
        # Short chat prompts stop early; long prompts (summaries) use most of their budget.
        predictor.observe(finished(rng.randint(20, 60), 512, rng.randint(40, 60)))
        predictor.observe(finished(rng.randint(1500, 2000), 512, rng.randint(400, 480)))
    assert predictor.predict_length(40, 512) == pytest.approx(50, rel=0.15)
    assert predictor.predict_length(1800, 512) == pytest.approx(440, rel=0.15)
    assert predictor.num_observations == 400


def test_error_ratio_falls_as_the_predictor_learns():
    predictor = LengthPredictor()
    rng = random.Random(1)
    predictor.observe(finished(50, 1024, 100))
    early = predictor.mean_abs_error_ratio
    for _ in range(300):
        predictor.observe(finished(rng.randint(40, 60), 1024, rng.randint(90, 110)))
    assert early > 5
    assert predictor.mean_abs_error_ratio < 0.2


def test_cancelled_requests_teach_nothing():
    predictor = LengthPredictor()
    predictor.observe(finished(50, 512, 3, FinishReason.CANCELLED))
    predictor.observe(finished(50, 512, 3, FinishReason.ERROR))
    assert predictor.num_observations == 0
    assert predictor.predict_length(50, 512) == 512
