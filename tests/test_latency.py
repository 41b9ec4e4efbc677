"""The latency quantities every report shares: percentiles interpolate between ranks, TPOT
spaces the tokens after the first, and SLO outcomes judge only the targets a request had."""

from __future__ import annotations

import pytest

from baton.core.metrics.latency import SLOOutcome, percentile, tpot_ms


def test_percentile_interpolates_between_the_closest_ranks_as_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_tpot_is_the_mean_gap_after_the_first_token():
    assert tpot_ms(first_token_s=1.0, finish_s=1.5, num_output_tokens=6) == 100.0
    assert tpot_ms(first_token_s=1.0, finish_s=1.0, num_output_tokens=1) == 0.0


def test_slo_outcome_judges_only_the_targets_a_request_had():
    def judge(ttft_target, tpot_target, num_output_tokens=10):
        return SLOOutcome.judge(
            200.0,
            40.0,
            num_output_tokens,
            ttft_target_ms=ttft_target,
            tpot_target_ms=tpot_target,
        )

    assert judge(200.0, 40.0) == SLOOutcome(True, True) and judge(200.0, 40.0).met
    assert judge(199.0, 40.0).met is False
    assert judge(None, 39.0) == SLOOutcome(None, False)
    assert judge(None, None).met is None
    # One output token has no gap to space out: its TPOT target is not judged.
    assert judge(500.0, 1.0, num_output_tokens=1) == SLOOutcome(True, None)
