"""Latency quantities defined once, for `baton simulate`, `baton bench`, `/v1/stats`, metrics
and tracing: a request's TPOT, whether it met its SLO targets, and percentiles of a sample."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from baton.core.request import FinishReason, Request

# Requests that ran to their end; a cancelled or failed one is not judged against its targets.
COMPLETED = (FinishReason.STOP, FinishReason.LENGTH)


def tpot_ms(first_token_s: float, finish_s: float, num_output_tokens: int) -> float:
    """Time per output token after the first: the mean gap between output tokens in ms, from
    the first token's time and the finish time in seconds; 0 with fewer than two tokens."""
    if num_output_tokens < 2:
        return 0.0
    return (finish_s - first_token_s) * 1e3 / (num_output_tokens - 1)


@dataclass(slots=True, frozen=True)
class SLOOutcome:
    """Whether a request met each target it had; None where there was nothing to judge."""

    ttft_met: bool | None
    tpot_met: bool | None

    @property
    def met(self) -> bool | None:
        """All judged targets met; None when none was judged (goodput counts that as met)."""
        judged = [m for m in (self.ttft_met, self.tpot_met) if m is not None]
        return all(judged) if judged else None

    @classmethod
    def judge(
        cls,
        ttft_ms: float,
        tpot_ms: float,
        num_output_tokens: int,
        *,
        ttft_target_ms: float | None,
        tpot_target_ms: float | None,
    ) -> SLOOutcome:
        """A target is met at or under it. TPOT is judged only with two or more output tokens:
        with one there is no gap between tokens to space out."""
        ttft = None if ttft_target_ms is None else ttft_ms <= ttft_target_ms
        tpot = None
        if tpot_target_ms is not None and num_output_tokens > 1:
            tpot = tpot_ms <= tpot_target_ms
        return cls(ttft, tpot)


class Latencies(Protocol):
    """What a request's SLO is judged on (baton.core.outputs.RequestTiming, which imports this
    module for its TPOT)."""

    ttft_ms: float
    tpot_ms: float


def slo_outcome(request: Request, timing: Latencies) -> SLOOutcome:
    """The outcome of a finished engine request against its own targets; only one that ran to
    completion (stop or length) is judged."""
    if request.finish_reason not in COMPLETED:
        return SLOOutcome(None, None)
    return SLOOutcome.judge(
        timing.ttft_ms,
        timing.tpot_ms,
        request.num_output_tokens,
        ttft_target_ms=request.slo.ttft_ms,
        tpot_target_ms=request.slo.tpot_ms,
    )


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100) of an ascending sequence; None when it is empty.

    Linear interpolation between the two closest ranks (Hyndman and Fan's type 7, numpy's
    default), chosen because vLLM's benchmark_serving reports numpy's percentiles, so `baton
    bench` figures compare with published ones, and because a small window's p99 then moves
    smoothly instead of jumping from one sample to the next as nearest rank does.
    """
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
