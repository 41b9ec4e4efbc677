"""What `baton simulate` measured per request, and the figures it reports over a set of them:
latencies, SLO attainment, goodput, and whether the waiting queue was still growing."""

from __future__ import annotations

import math
from dataclasses import dataclass

from baton.core.metrics import latency
from baton.core.request import SLO, FinishReason, Request


@dataclass(slots=True)
class RequestRecord:
    """What the simulation measured for one request (seconds on the simulated clock)."""

    request_id: str
    class_name: str
    arrival_s: float
    num_output_tokens: int
    ttft_ms_target: float | None
    tpot_ms_target: float | None
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    # Stop (its answer ended) or length (cut at max_tokens); None when rejected.
    finish_reason: FinishReason | None = None
    # Refused by SLO admission control, at arrival or while queued (its times are then its
    # arrival time but for `finish_s`, when it was refused).
    rejected: bool = False
    num_preemptions: int = 0

    @property
    def ttft_ms(self) -> float:
        return (self.first_token_s - self.arrival_s) * 1000

    @property
    def tpot_ms(self) -> float:
        return latency.tpot_ms(self.first_token_s, self.finish_s, self.num_output_tokens)

    @property
    def wait_ms(self) -> float:
        return (self.first_scheduled_s - self.arrival_s) * 1000

    @property
    def slo_met(self) -> bool:
        """A rejected request missed its targets; one without targets met them."""
        if self.rejected:
            return False
        outcome = latency.SLOOutcome.judge(
            self.ttft_ms,
            self.tpot_ms,
            self.num_output_tokens,
            ttft_target_ms=self.ttft_ms_target,
            tpot_target_ms=self.tpot_ms_target,
        )
        return outcome.met is not False


def record_of(request: Request, class_name: str) -> RequestRecord:
    if request.finish_reason is FinishReason.REFUSED:
        return rejected_record(
            request.request_id, class_name, request.arrival_time, request.finish_time, request.slo
        )
    return RequestRecord(
        request.request_id,
        class_name,
        request.arrival_time,
        request.num_output_tokens,
        request.slo.ttft_ms,
        request.slo.tpot_ms,
        request.first_scheduled_time,
        request.first_token_time,
        request.finish_time,
        request.finish_reason,
        num_preemptions=request.num_preemptions,
    )


def rejected_record(
    request_id: str, class_name: str, arrival: float, refused: float, slo: SLO
) -> RequestRecord:
    """A request SLO admission control refused at `refused`: at arrival, or after waiting."""
    return RequestRecord(
        request_id,
        class_name,
        arrival,
        0,
        slo.ttft_ms,
        slo.tpot_ms,
        arrival,
        arrival,
        refused,
        rejected=True,
    )


def summarize(records: list[RequestRecord]) -> dict[str, float | int | None]:
    """The figures `baton simulate` reports for a set of requests. Goodput and attainment count
    every arrival, a rejected one as missing its SLO; latencies are of the served ones (None
    where none was served)."""
    if not records:
        return {"num_requests": 0}
    served = [r for r in records if not r.rejected]
    start = min(r.arrival_s for r in records)
    end = max(r.finish_s for r in records)
    duration = max(end - start, 1e-9)
    met = sum(r.slo_met for r in records)
    ttfts = sorted(r.ttft_ms for r in served)
    tpots = sorted(r.tpot_ms for r in served)
    return {
        "num_requests": len(records),
        "rejected": len(records) - len(served),
        "duration_s": duration,
        "throughput_rps": len(served) / duration,
        "goodput_rps": met / duration,
        "slo_attainment": met / len(records),
        "ttft_p50_ms": latency.percentile(ttfts, 50),
        "ttft_p99_ms": latency.percentile(ttfts, 99),
        "ttft_max_ms": ttfts[-1] if ttfts else None,
        "tpot_p50_ms": latency.percentile(tpots, 50),
        "tpot_p99_ms": latency.percentile(tpots, 99),
        "max_wait_ms": max((r.wait_ms for r in served), default=None),
        "max_preemptions_per_request": max(r.num_preemptions for r in records),
    }


# Queue growth under this share of the second half's arrivals, or under this many requests, is
# the noise of a stable load (a burst late in the run); above both, the load outruns the machine.
QUEUE_GROWTH_SHARE = 0.02
QUEUE_GROWTH_MIN = 10


@dataclass(frozen=True, slots=True)
class QueueTrend:
    """Whether the waiting queue was still growing when the arrivals ended: a run shorter than
    the time an overload takes to show would otherwise report it as a healthy load. Counted at
    the midpoint and the end of the arrival span, over the requests that were served."""

    waiting_at_midpoint: int
    waiting_at_last_arrival: int
    # Served arrivals in the span's second half over the requests that started service then:
    # above 1 the queue grows, as with arrivals faster than the machine serves them.
    arrival_over_service_rate: float

    @property
    def growing(self) -> bool:
        growth = self.waiting_at_last_arrival - self.waiting_at_midpoint
        return (
            growth >= QUEUE_GROWTH_MIN and self.arrival_over_service_rate > 1 + QUEUE_GROWTH_SHARE
        )

    def warning(self) -> str | None:
        if not self.growing:
            return None
        pace = (
            "none started while more arrived"
            if math.isinf(self.arrival_over_service_rate)
            else f"requests arrived {self.arrival_over_service_rate:.2f}x as fast as they started"
        )
        return (
            "the waiting queue was still growing when the arrivals ended "
            f"({self.waiting_at_midpoint} waiting at the midpoint, "
            f"{self.waiting_at_last_arrival} at the last arrival; {pace}): "
            "the load is past what this machine serves, and a longer run would show worse figures"
        )

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "waiting_at_midpoint": self.waiting_at_midpoint,
            "waiting_at_last_arrival": self.waiting_at_last_arrival,
            "arrival_over_service_rate": self.arrival_over_service_rate,
            "growing": self.growing,
        }


def queue_trend(records: list[RequestRecord]) -> QueueTrend:
    """The waiting queue (arrived, not yet scheduled) at the midpoint and at the end of the
    arrivals; a refused request never waited, so it is not counted."""
    served = [r for r in records if not r.rejected]
    if not served:
        return QueueTrend(0, 0, 1.0)
    first = min(r.arrival_s for r in served)
    last = max(r.arrival_s for r in served)
    middle = (first + last) / 2

    def waiting(at: float) -> int:
        return sum(1 for r in served if r.arrival_s <= at < r.first_scheduled_s)

    at_middle, at_end = waiting(middle), waiting(last)
    arrived = sum(1 for r in served if middle < r.arrival_s <= last)
    started = arrived - (at_end - at_middle)
    ratio = arrived / started if started > 0 else (math.inf if arrived else 1.0)
    return QueueTrend(at_middle, at_end, ratio)
