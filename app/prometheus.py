"""`GET /metrics`: the engine's published stats snapshot and the `core.metric_aggregates`
histograms and counters in Prometheus's text format, names prefixed `baton:` after vLLM's.
Everything is read at scrape time by one collector on a per-app registry, so nothing is paid
per token and several servers can share a process."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from app.async_engine import AsyncEngine
from core.engine_stats import EngineStats
from core.metric_aggregates import EngineMetrics, Histogram

PREFIX = "baton:"


class ServerMetrics:
    """The app's registry, the engine aggregates it reads, and what only the app sees."""

    def __init__(self, engine: AsyncEngine, window_s: float = 60.0, *, record: bool = True) -> None:
        self.engine = engine
        self.started_at = time.monotonic()
        self.aggregates = EngineMetrics(window_s, engine.clock)
        if record:
            engine.attach(self.aggregates)
        # Requests refused with 429 before reaching the engine; counted on the event loop.
        self.admission_rejections = 0
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(self))

    def count_rejection(self) -> None:
        self.admission_rejections += 1

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def metrics_endpoint(request: Request) -> Response:
    server_metrics: ServerMetrics = request.app.state.metrics
    return Response(server_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


class EngineCollector(Collector):
    def __init__(self, server_metrics: ServerMetrics) -> None:
        self.server_metrics = server_metrics

    def collect(self) -> Iterator[Metric]:
        stats = self.server_metrics.engine.stats
        yield from _engine_state(stats)
        yield _counter("num_preemptions", "Preemptions (by recompute).", stats.num_preemptions)
        yield _counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            stats.prefix_cache_queries,
        )
        yield _counter(
            "prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            stats.prefix_cache_hits,
        )
        yield _counter(
            "admission_rejections",
            "Requests refused with 429 before reaching the engine.",
            self.server_metrics.admission_rejections,
        )
        aggregates = self.server_metrics.aggregates
        with aggregates.lock:
            yield from _aggregates(aggregates)


def _engine_state(stats: EngineStats) -> Iterator[Metric]:
    yield _gauge("num_requests_running", "Requests running.", stats.num_running)
    yield _gauge("num_requests_waiting", "Requests waiting.", stats.num_waiting)
    yield _gauge("kv_cache_usage_perc", "KV blocks in use (0-1).", stats.kv_cache_usage)
    by_priority = GaugeMetricFamily(
        PREFIX + "num_requests_waiting_by_priority",
        "Requests waiting, by priority.",
        labels=["priority"],
    )
    for priority, count in stats.waiting_by_priority:
        by_priority.add_metric([str(priority)], count)
    yield by_priority
    if stats.step_cost_error is not None:
        yield _gauge(
            "step_cost_model_mean_error_ratio",
            "Running mean of |predicted - measured| / measured step time.",
            stats.step_cost_error,
        )


def _aggregates(aggregates: EngineMetrics) -> Iterator[Metric]:
    totals = aggregates.totals
    yield _counter("prompt_tokens", "Prompt tokens of finished requests.", totals.prompt_tokens)
    yield _counter(
        "generation_tokens", "Tokens generated for finished requests.", totals.generation_tokens
    )
    success = CounterMetricFamily(
        PREFIX + "request_success",
        "Finished requests, by finish reason.",
        labels=["finished_reason"],
    )
    for reason, count in aggregates.finished_by_reason.items():
        success.add_metric([reason.value], count)
    yield success
    for name, counts, doc in (
        ("slo_attained", aggregates.slo_attained, "Completed requests that met an SLO target."),
        ("slo_missed", aggregates.slo_missed, "Completed requests that missed an SLO target."),
    ):
        family = CounterMetricFamily(PREFIX + name, doc, labels=["slo"])
        for slo, count in counts.items():
            family.add_metric([slo], count)
        yield family
    yield _counter("num_steps", "Engine steps that ran a batch.", totals.steps)
    yield _histogram("time_to_first_token_seconds", "Arrival to first token.", aggregates.ttft)
    yield _histogram("inter_token_latency_seconds", "Time between tokens.", aggregates.itl)
    yield _histogram(
        "request_time_per_output_token_seconds",
        "Mean time per output token after the first, per request.",
        aggregates.tpot,
    )
    yield _histogram("e2e_request_latency_seconds", "Arrival to finish.", aggregates.e2e)
    yield _histogram("request_queue_time_seconds", "Arrival to first scheduled.", aggregates.queue)
    yield _histogram("step_duration_seconds", "Engine step time.", aggregates.step_duration)
    yield _histogram("step_batch_size", "Sequences per step.", aggregates.step_batch_size)
    yield _histogram(
        "step_prefill_tokens", "Prefill tokens per step.", aggregates.step_prefill_tokens
    )
    yield _histogram("step_decode_tokens", "Decode tokens per step.", aggregates.step_decode_tokens)
    yield _histogram(
        "step_cost_model_error_ratio",
        "|predicted - measured| / measured step time of the step-cost model.",
        aggregates.step_cost_error,
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    bounds = [*(_bound(b) for b in histogram.bounds), "+Inf"]
    buckets = list(zip(bounds, histogram.cumulative(), strict=True))
    return HistogramMetricFamily(PREFIX + name, doc, buckets=buckets, sum_value=histogram.sum)


def _bound(value: float) -> str:
    return repr(float(value))
