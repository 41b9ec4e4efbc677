"""ArrivalRate's per-target counts answer exactly what a pass over the window's arrivals would."""

from __future__ import annotations

import random

import pytest

from core.arrival_rate import MIN_SPAN_S, ArrivalRate


def brute_force(arrivals, now, window_s, within_s, deadline_s, below_s):
    kept = [(t, target) for t, target in arrivals if t >= now - window_s and target is not None]
    if not kept:
        return 0.0, 0.0
    since = min(t for t, target in arrivals if target is not None)
    span = max(MIN_SPAN_S, min(window_s, now - since))
    ahead = sum(max(0.0, min(within_s, deadline_s - target)) for _, target in kept) / span
    below = sum(1 for _, target in kept if target < below_s) / span
    return ahead, below


@pytest.mark.parametrize("seed", range(5))
def test_counts_match_a_pass_over_the_window_as_arrivals_expire(seed):
    rng = random.Random(seed)
    rate = ArrivalRate(window_s=2.0)
    arrivals = []
    now = 0.0
    for _ in range(400):
        now += rng.expovariate(40.0)
        target = rng.choice([None, 0.2, 0.5, 0.5, 5.0])
        rate.add(now, target)
        arrivals.append((now, target))
        within_s, deadline_s, below_s = rng.uniform(0, 3), rng.uniform(0, 6), rng.uniform(0, 6)
        expected_ahead, expected_below = brute_force(
            arrivals, now, 2.0, within_s, deadline_s, below_s
        )
        assert rate.expected_ahead(within_s, deadline_s) == pytest.approx(expected_ahead)
        assert rate.per_s_below(below_s) == pytest.approx(expected_below)
    # Only the window's targets are kept: expired arrivals left no zero counts behind.
    assert sum(rate._per_target.values()) == len(rate._arrivals)
    assert all(count > 0 for count in rate._per_target.values())
