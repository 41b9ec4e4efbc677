"""`GET /metrics`: the engine's published stats snapshot and the histograms and counters
of `core/metrics/metric_aggregates.py` in Prometheus's text format. Every series is declared once in
`SERIES` with Baton's name (`baton:` prefix) and, where vLLM exports the same measurement, vLLM's
names; `--metrics-style` picks which names a scrape shows, so vLLM's Grafana dashboards read Baton
unchanged. Everything is read at scrape time by one collector on a per-app registry, so nothing is
paid per token and several servers can share a process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

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

from baton.app.engine.client import EngineClient
from baton.app.settings import METRICS_STYLES
from baton.core.engine_stats import EngineStats, ReplicaStatus
from baton.core.metrics.metric_aggregates import EngineMetrics, Histogram
from baton.core.request import FinishReason

PREFIX = "baton:"
VLLM_PREFIX = "vllm:"
# vLLM's labels for the finish reasons it spells differently; the others agree.
VLLM_FINISHED_REASON = {
    FinishReason.CANCELLED.value: "abort",
    # Refused by SLO admission control before it started: vLLM has no word for it.
    FinishReason.REFUSED.value: "abort",
}


class Sources(NamedTuple):
    """What one scrape reads: the step loop's snapshot, the aggregates, the app's own count."""

    stats: EngineStats
    aggregates: EngineMetrics
    admission_rejections: int
    replicas: list[ReplicaStatus]


# A reading: one value, a histogram, a value per tuple of label values, or None (not exported).
Points = float | Histogram | dict[tuple[str, ...], float] | None


@dataclass(frozen=True, slots=True)
class Series:
    """One measurement and the names it goes by. `vllm` lists vLLM's names for it, current
    first, then names older vLLM releases used that dashboards still query."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    doc: str
    read: Callable[[Sources], Points]
    vllm: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()


def _gauge(name: str, doc: str, read: Callable[[Sources], Points], *vllm: str) -> Series:
    return Series(name, "gauge", doc, read, vllm)


def _counter(name: str, doc: str, read: Callable[[Sources], Points], *vllm: str) -> Series:
    return Series(name, "counter", doc, read, vllm)


def _histogram(name: str, doc: str, read: Callable[[Sources], Histogram], *vllm: str) -> Series:
    return Series(name, "histogram", doc, read, vllm)


def _per_replica(read: Callable[[ReplicaStatus], float]) -> Callable[[Sources], Points]:
    """A reading per replica, labelled `replica` and its `role` (prefill, decode, or both): a
    single-process server is replica "0", so a dashboard's per-replica panels read one server
    and N replicas alike."""

    def points(sources: Sources) -> Points:
        return {(str(r.replica_id), r.role): float(read(r)) for r in sources.replicas}

    return points


def _spec(sources: Sources, name: str) -> Points:
    """A speculative-decoding total; not exported by an engine that does not speculate."""
    spec = sources.stats.spec_decode
    return None if spec is None else float(getattr(spec, name))


REPLICA_LABELS = ("replica", "role")

SERIES: tuple[Series, ...] = (
    _gauge("num_requests_running", "Requests running.", lambda s: s.stats.num_running,
           "num_requests_running"),
    _gauge("num_requests_waiting", "Requests waiting.", lambda s: s.stats.num_waiting,
           "num_requests_waiting"),
    _gauge("kv_cache_usage_perc", "KV blocks in use (0-1).", lambda s: s.stats.kv_cache_usage,
           "kv_cache_usage_perc", "gpu_cache_usage_perc"),
    Series("num_requests_waiting_by_priority", "gauge", "Requests waiting, by priority.",
           lambda s: {(str(p),): n for p, n in s.stats.waiting_by_priority},
           labels=("priority",)),
    _gauge("step_cost_model_mean_error_ratio",
           "Running mean of |predicted - measured| / measured step time.",
           lambda s: s.stats.step_cost_error),
    _counter("num_preemptions", "Preemptions (by recompute).",
             lambda s: s.stats.num_preemptions, "num_preemptions"),
    _counter("kv_growth_holds",
             "Steps in which the KV growth forecast held a waiting prompt back.",
             lambda s: s.stats.num_kv_growth_holds),
    _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             lambda s: s.stats.prefix_cache_queries, "prefix_cache_queries"),
    _counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.",
             lambda s: s.stats.prefix_cache_hits, "prefix_cache_hits"),
    _gauge("grammar_cache_entries", "Compiled output constraints kept for reuse.",
           lambda s: s.stats.grammar_cache_entries),
    _gauge("grammar_cache_bytes", "Memory the compiled output constraints kept hold.",
           lambda s: s.stats.grammar_cache_bytes),
    _counter("spec_decode_num_drafts",
             "Speculative decoding: sequences that verified draft tokens in a step.",
             lambda s: _spec(s, "num_drafts"), "spec_decode_num_drafts"),
    _counter("spec_decode_num_draft_tokens", "Speculative decoding: draft tokens verified.",
             lambda s: _spec(s, "num_draft_tokens"), "spec_decode_num_draft_tokens"),
    _counter("spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens accepted.",
             lambda s: _spec(s, "num_accepted_tokens"), "spec_decode_num_accepted_tokens"),
    Series("spec_decode_num_accepted_tokens_per_pos", "counter",
           "Speculative decoding: draft tokens accepted, by position in their draft.",
           lambda s: None if s.stats.spec_decode is None else {
               (str(i),): n for i, n in enumerate(s.stats.spec_decode.accepted_per_position)},
           ("spec_decode_num_accepted_tokens_per_pos",), ("position",)),
    _counter("admission_rejections", "Requests refused with 429 before reaching the engine.",
             lambda s: s.admission_rejections),
    _counter("prompt_tokens", "Prompt tokens of finished requests.",
             lambda s: s.aggregates.totals.prompt_tokens, "prompt_tokens"),
    _counter("generation_tokens", "Tokens generated for finished requests.",
             lambda s: s.aggregates.totals.generation_tokens, "generation_tokens"),
    Series("request_success", "counter", "Finished requests, by finish reason.",
           lambda s: {(r.value,): n for r, n in s.aggregates.finished_by_reason.items()},
           ("request_success",), ("finished_reason",)),
    _counter("request_goodput",
             "Completed requests that met every SLO target they had (none counts as met); "
             "its rate is goodput.",
             lambda s: s.aggregates.totals.good_requests),
    Series("slo_attained", "counter", "Completed requests that met an SLO target.",
           lambda s: {(slo,): n for slo, n in s.aggregates.slo_attained.items()},
           labels=("slo",)),
    Series("slo_missed", "counter", "Completed requests that missed an SLO target.",
           lambda s: {(slo,): n for slo, n in s.aggregates.slo_missed.items()},
           labels=("slo",)),
    _counter("num_steps", "Engine steps that ran a batch.", lambda s: s.aggregates.totals.steps),
    _histogram("time_to_first_token_seconds", "Arrival to first token.",
               lambda s: s.aggregates.ttft, "time_to_first_token_seconds"),
    _histogram("inter_token_latency_seconds", "Time between tokens.",
               lambda s: s.aggregates.itl,
               "inter_token_latency_seconds", "time_per_output_token_seconds"),
    _histogram("request_time_per_output_token_seconds",
               "Mean time per output token after the first, per request.",
               lambda s: s.aggregates.tpot, "request_time_per_output_token_seconds"),
    _histogram("e2e_request_latency_seconds", "Arrival to finish.",
               lambda s: s.aggregates.e2e, "e2e_request_latency_seconds"),
    _histogram("request_queue_time_seconds", "Arrival to first scheduled.",
               lambda s: s.aggregates.queue, "request_queue_time_seconds"),
    _histogram("request_prefill_time_seconds", "First scheduled to first token.",
               lambda s: s.aggregates.prefill_time, "request_prefill_time_seconds"),
    _histogram("request_decode_time_seconds", "First token to finish.",
               lambda s: s.aggregates.decode_time, "request_decode_time_seconds"),
    _histogram("request_inference_time_seconds", "First scheduled to finish.",
               lambda s: s.aggregates.inference_time, "request_inference_time_seconds"),
    _histogram("request_prompt_tokens", "Prompt tokens per finished request.",
               lambda s: s.aggregates.request_prompt_tokens, "request_prompt_tokens"),
    _histogram("request_generation_tokens", "Generated tokens per finished request.",
               lambda s: s.aggregates.request_generation_tokens, "request_generation_tokens"),
    _histogram("request_params_max_tokens", "max_tokens asked for, per finished request.",
               lambda s: s.aggregates.request_max_tokens,
               "request_params_max_tokens", "request_max_num_generation_tokens"),
    _histogram("step_duration_seconds", "Engine step time.",
               lambda s: s.aggregates.step_duration),
    _histogram("step_batch_size", "Sequences per step.", lambda s: s.aggregates.step_batch_size),
    _histogram("step_tokens", "Tokens (prefill and decode) per step.",
               lambda s: s.aggregates.step_tokens, "iteration_tokens_total"),
    _histogram("step_prefill_tokens", "Prefill tokens per step.",
               lambda s: s.aggregates.step_prefill_tokens),
    _histogram("step_decode_tokens", "Decode tokens per step.",
               lambda s: s.aggregates.step_decode_tokens),
    _histogram("step_cost_model_error_ratio",
               "|predicted - measured| / measured step time of the step-cost model.",
               lambda s: s.aggregates.step_cost_error),
    Series("replica_healthy", "gauge", "1 while the engine replica serves, 0 while it restarts.",
           _per_replica(lambda r: r.healthy), labels=REPLICA_LABELS),
    Series("replica_num_requests_running", "gauge", "Requests running, per engine replica.",
           _per_replica(lambda r: r.stats.num_running), labels=REPLICA_LABELS),
    Series("replica_num_requests_waiting", "gauge", "Requests waiting, per engine replica.",
           _per_replica(lambda r: r.stats.num_waiting), labels=REPLICA_LABELS),
    Series("replica_kv_cache_usage_perc", "gauge", "KV blocks in use (0-1), per engine replica.",
           _per_replica(lambda r: r.stats.kv_cache_usage), labels=REPLICA_LABELS),
    Series("replica_requests_routed", "counter", "Requests the router sent to each replica.",
           _per_replica(lambda r: r.requests_routed), labels=REPLICA_LABELS),
    Series("replica_requests_finished", "counter", "Requests each replica finished.",
           _per_replica(lambda r: r.requests_finished), labels=REPLICA_LABELS),
    Series("replica_num_preemptions", "counter", "Preemptions, per engine replica.",
           _per_replica(lambda r: r.stats.num_preemptions), labels=REPLICA_LABELS),
    Series("replica_prefix_cache_queries", "counter",
           "Prompt tokens looked up in each replica's prefix cache.",
           _per_replica(lambda r: r.stats.prefix_cache_queries), labels=REPLICA_LABELS),
    Series("replica_prefix_cache_hits", "counter",
           "Prompt tokens served from each replica's prefix cache.",
           _per_replica(lambda r: r.stats.prefix_cache_hits), labels=REPLICA_LABELS),
    Series("replica_kv_transfers", "counter",
           "Prefilled requests' KV transfers each replica sent or received, failed ones too.",
           _per_replica(lambda r: r.kv_transfers.count), labels=REPLICA_LABELS),
    Series("replica_kv_transfers_failed", "counter",
           "KV transfers each replica sent or received that failed.",
           _per_replica(lambda r: r.kv_transfers.failed), labels=REPLICA_LABELS),
    Series("replica_kv_transfer_bytes", "counter",
           "Bytes of KV each replica sent or received.",
           _per_replica(lambda r: r.kv_transfers.num_bytes), labels=REPLICA_LABELS),
    Series("replica_kv_transfer_seconds", "counter",
           "Seconds each replica's KV transfers took, from the read asked to the write done.",
           _per_replica(lambda r: r.kv_transfers.seconds), labels=REPLICA_LABELS),
    Series("replica_migrations", "counter",
           "Running decodes each replica received by live migration, failed ones too.",
           _per_replica(lambda r: r.kv_transfers.migrations), labels=REPLICA_LABELS),
)  # fmt: skip


class ServerMetrics:
    """The app's registry, the engine aggregates it reads, and what only the app sees."""

    def __init__(
        self,
        engine: EngineClient,
        window_s: float = 60.0,
        *,
        record: bool = True,
        model_name: str = "",
        style: str = "baton",
    ) -> None:
        if style not in METRICS_STYLES:
            raise ValueError(f"metrics style must be one of {METRICS_STYLES}, got {style!r}")
        self.engine = engine
        self.started_at = time.monotonic()
        self.aggregates = EngineMetrics(window_s, engine.clock)
        if record:
            engine.attach(self.aggregates)
        # Requests refused with 429 before reaching the engine; counted on the event loop.
        self.admission_rejections = 0
        self.registry = CollectorRegistry()
        # vLLM labels every series with the model and the engine index; one engine here.
        vllm_labels = {"model_name": model_name, "engine": "0"}
        self.registry.register(EngineCollector(self, style, vllm_labels))

    def count_rejection(self) -> None:
        self.admission_rejections += 1

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def metrics_endpoint(request: Request) -> Response:
    server_metrics: ServerMetrics = request.app.state.metrics
    return Response(server_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


class EngineCollector(Collector):
    def __init__(
        self, server_metrics: ServerMetrics, style: str, vllm_labels: dict[str, str]
    ) -> None:
        self.server_metrics = server_metrics
        self.style = style
        self.vllm_labels = vllm_labels

    def collect(self) -> Iterator[Metric]:
        server_metrics = self.server_metrics
        aggregates = server_metrics.aggregates
        engine = server_metrics.engine
        sources = Sources(
            engine.stats, aggregates, server_metrics.admission_rejections, engine.replica_status()
        )
        families = []
        # Families copy their values, so the lock is held only while they are built.
        with aggregates.lock:
            for series in SERIES:
                points = series.read(sources)
                if points is not None:
                    families.extend(self._families(series, points))
        yield from families

    def _families(self, series: Series, points: Points) -> Iterator[Metric]:
        """Baton's name unless only vLLM's are asked for; vLLM's names, with its labels and
        label values, unless only Baton's are. A series vLLM lacks keeps Baton's name always."""
        if self.style != "vllm" or not series.vllm:
            yield _family(PREFIX + series.name, series, {}, points)
        if self.style != "baton":
            for name in series.vllm:
                yield _family(VLLM_PREFIX + name, series, self.vllm_labels, _vllm_values(points))


def _vllm_values(points: Points) -> Points:
    """The points under vLLM's label values; reasons it spells alike are summed."""
    if not isinstance(points, dict):
        return points
    renamed: dict = {}
    for key, value in points.items():
        vllm_key = tuple(VLLM_FINISHED_REASON.get(v, v) for v in key)
        renamed[vllm_key] = renamed.get(vllm_key, 0) + value
    return renamed


def _family(name: str, series: Series, fixed: dict[str, str], points: Points) -> Metric:
    labels = [*fixed, *series.labels]
    family_type = {
        "gauge": GaugeMetricFamily,
        "counter": CounterMetricFamily,
        "histogram": HistogramMetricFamily,
    }[series.kind]
    family = family_type(name, series.doc, labels=labels)
    assert points is not None
    by_labels = points if isinstance(points, dict) else {(): points}
    for values, value in by_labels.items():
        label_values = [*fixed.values(), *values]
        if isinstance(value, Histogram):
            family.add_metric(label_values, _buckets(value), value.sum)
        else:
            family.add_metric(label_values, value)
    return family


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    bounds = [*(repr(float(b)) for b in histogram.bounds), "+Inf"]
    return list(zip(bounds, histogram.cumulative(), strict=True))
