"""Plain-Python aggregates of what the engine did: counters, bucketed histograms and a sliding
window of recent requests and steps. Fed by the engine's step and finish listeners in the step
thread; read by `/metrics` and `/v1/stats` from the event loop under one lock."""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from baton.core.metrics.latency import COMPLETED, slo_outcome
from baton.core.outputs import RequestOutput, RequestTiming
from baton.core.request import FinishReason, Request
from baton.core.step_stats import StepStats

logger = logging.getLogger("baton.requests")

# Seconds. Sub-millisecond first tokens on a small model through minutes-long queues.
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# Gaps between tokens: from a cheap decode step on the GPU up to a preemption's recompute.
ITL_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
)  # fmt: skip
STEP_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# |predicted - measured| / measured step time.
RATIO_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
# Bounds the windows' memory on a server stepping thousands of times a second.
MAX_WINDOW_STEPS = 200_000


class Histogram:
    """Prometheus-style buckets (`le` upper bounds, +Inf last) without the library."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, values: Sequence[float]) -> None:
        # One call per request for all its token gaps: a method call per token would cost more
        # than the bucketing itself.
        bounds, counts, find = self.bounds, self.counts, bisect.bisect_left
        for value in values:
            counts[find(bounds, value)] += 1
        self.sum += sum(values)
        self.count += len(values)

    def cumulative(self) -> list[int]:
        total = 0
        out = []
        for count in self.counts:
            total += count
            out.append(total)
        return out


def token_gaps(token_times: Sequence[float]) -> list[float]:
    """Inter-token latencies in seconds."""
    return [b - a for a, b in itertools.pairwise(token_times)]


@dataclass(slots=True, frozen=True)
class FinishedRecord:
    time: float
    num_prompt_tokens: int
    num_output_tokens: int
    completed: bool
    ttft_ms: float
    tpot_ms: float | None
    slo_met: bool | None


@dataclass(slots=True, frozen=True)
class StepRecord:
    time: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    duration_s: float


@dataclass(slots=True)
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    # Completed requests that met every target they had (none counts as met): goodput's count.
    good_requests: int = 0


class EngineMetrics:
    """Everything `/metrics` and `/v1/stats` report beyond the engine's live state."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.lock = threading.Lock()
        self.totals = Counters()
        self.finished_by_reason = {reason: 0 for reason in FinishReason}
        self.slo_attained = {"ttft": 0, "tpot": 0}
        self.slo_missed = {"ttft": 0, "tpot": 0}
        self.ttft = Histogram(LATENCY_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self.e2e = Histogram(LATENCY_BUCKETS_S)
        self.queue = Histogram(LATENCY_BUCKETS_S)
        self.tpot = Histogram(ITL_BUCKETS_S)
        # First scheduled to first token, first token to finish, first scheduled to finish.
        self.prefill_time = Histogram(LATENCY_BUCKETS_S)
        self.decode_time = Histogram(LATENCY_BUCKETS_S)
        self.inference_time = Histogram(LATENCY_BUCKETS_S)
        self.request_prompt_tokens = Histogram(COUNT_BUCKETS)
        self.request_generation_tokens = Histogram(COUNT_BUCKETS)
        self.request_max_tokens = Histogram(COUNT_BUCKETS)
        self.step_duration = Histogram(STEP_BUCKETS_S)
        self.step_batch_size = Histogram(COUNT_BUCKETS)
        self.step_prefill_tokens = Histogram(COUNT_BUCKETS)
        self.step_decode_tokens = Histogram(COUNT_BUCKETS)
        self.step_tokens = Histogram(COUNT_BUCKETS)
        self.step_cost_error = Histogram(RATIO_BUCKETS)
        self.step_cost_model = None
        self.recent_requests: deque[FinishedRecord] = deque()
        self.recent_steps: deque[StepRecord] = deque(maxlen=MAX_WINDOW_STEPS)

    def attach(self, engine) -> None:
        """Subscribe to `engine`'s listeners and read its clock."""
        self.clock = engine.clock
        # The model refits in its own step listener, registered before this one, and leaves
        # the newest step's prediction error behind for this one to count.
        self.step_cost_model = getattr(engine, "step_cost_model", None)
        engine.step_listeners.append(self.on_step)
        engine.finish_listeners.append(self.on_finish)

    def on_step(self, stats: StepStats) -> None:
        record = StepRecord(
            stats.finished,
            stats.num_seqs,
            stats.num_prefill_tokens,
            stats.num_decode_tokens,
            stats.duration_s,
        )
        with self.lock:
            self.totals.steps += 1
            self.step_duration.observe(record.duration_s)
            self.step_batch_size.observe(record.num_seqs)
            self.step_prefill_tokens.observe(record.num_prefill_tokens)
            self.step_decode_tokens.observe(record.num_decode_tokens)
            self.step_tokens.observe(record.num_prefill_tokens + record.num_decode_tokens)
            model = self.step_cost_model
            if model is not None and model.last_error_ratio is not None and record.duration_s > 0:
                self.step_cost_error.observe(model.last_error_ratio)
            self.recent_steps.append(record)
            _prune(self.recent_steps, stats.finished - self.window_s)

    def on_finish(self, request: Request, output: RequestOutput) -> None:
        timing = output.timing or RequestTiming.of(request)
        outcome = slo_outcome(request, timing)
        gaps = token_gaps(request.token_times)
        completed = request.finish_reason in COMPLETED
        record = FinishedRecord(
            request.finish_time or 0.0,
            request.num_prompt_tokens,
            request.num_output_tokens,
            completed,
            timing.ttft_ms,
            timing.tpot_ms if request.num_output_tokens > 1 else None,
            outcome.met,
        )
        with self.lock:
            totals = self.totals
            totals.requests += 1
            totals.prompt_tokens += request.num_prompt_tokens
            totals.generation_tokens += request.num_output_tokens
            totals.good_requests += completed and outcome.met is not False
            self.finished_by_reason[request.finish_reason or FinishReason.ERROR] += 1
            for name, met in (("ttft", outcome.ttft_met), ("tpot", outcome.tpot_met)):
                if met is not None:
                    (self.slo_attained if met else self.slo_missed)[name] += 1
            self.e2e.observe(timing.e2e_ms / 1e3)
            if request.first_scheduled_time is not None:
                self.queue.observe(timing.queue_ms / 1e3)
                self.inference_time.observe((timing.e2e_ms - timing.queue_ms) / 1e3)
            if request.first_token_time is not None:
                self.ttft.observe(timing.ttft_ms / 1e3)
                self.decode_time.observe((timing.e2e_ms - timing.ttft_ms) / 1e3)
                if request.first_scheduled_time is not None:
                    self.prefill_time.observe((timing.ttft_ms - timing.queue_ms) / 1e3)
            self.request_prompt_tokens.observe(request.num_prompt_tokens)
            self.request_generation_tokens.observe(request.num_output_tokens)
            if request.sampling_params.max_tokens is not None:
                self.request_max_tokens.observe(request.sampling_params.max_tokens)
            if record.tpot_ms is not None:
                self.tpot.observe(record.tpot_ms / 1e3)
            self.itl.observe_many(gaps)
            self.recent_requests.append(record)
            _prune(self.recent_requests, record.time - self.window_s)
        logger.info(
            "request finished: id=%s prompt_tokens=%d output_tokens=%d queue_ms=%.1f "
            "ttft_ms=%.1f tpot_ms=%.2f e2e_ms=%.1f finish_reason=%s preemptions=%d "
            "cached_prompt_tokens=%d",
            request.request_id,
            request.num_prompt_tokens,
            request.num_output_tokens,
            timing.queue_ms,
            timing.ttft_ms,
            timing.tpot_ms,
            timing.e2e_ms,
            request.finish_reason.value if request.finish_reason else "error",
            timing.preemptions,
            timing.cached_prompt_tokens,
        )

    def window(self) -> tuple[list[FinishedRecord], list[StepRecord]]:
        """Copies of the requests and steps that ended within the window, oldest first."""
        now = self.clock()
        with self.lock:
            _prune(self.recent_requests, now - self.window_s)
            _prune(self.recent_steps, now - self.window_s)
            return list(self.recent_requests), list(self.recent_steps)


def _prune(records: deque, oldest: float) -> None:
    while records and records[0].time < oldest:
        records.popleft()
