"""Per-request OpenTelemetry tracing: one SERVER span per engine request, with children for the
queue, each prefill chunk, the KV transfer of a request prefilled on one replica and decoded on
another, and the decode, built once the request has finished from the engine's own timestamps.
With no exporter configured none of it exists."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from baton.app.engine.client import EngineClient
from baton.app.settings import ServerSettings
from baton.core.metrics.latency import percentile, slo_outcome
from baton.core.metrics.metric_aggregates import token_gaps
from baton.core.outputs import RequestOutput, RequestTiming
from baton.core.replicas.kv_transfer import KVHandOff
from baton.core.request import FinishReason, Request

logger = logging.getLogger("baton.telemetry")
PROPAGATOR = TraceContextTextMapPropagator()
OTLP_TRACES_PATH = "/v1/traces"
SAMPLED = TraceFlags(TraceFlags.SAMPLED)


@dataclass(slots=True, frozen=True)
class TraceStart:
    """What only the route knows about a request: the API operation and the caller's trace."""

    operation: str
    parent: SpanContext | None
    # Set by the replicas' front end on a request that moved from a prefill replica, and on
    # one whose running decode migrated to another replica.
    hand_off: KVHandOff | None = None
    migration: KVHandOff | None = None


def _migration_attributes(migration: KVHandOff) -> dict[str, int | float]:
    return {
        "baton.migration.source_replica": migration.prefill_replica,
        "baton.migration.target_replica": migration.decode_replica,
        "baton.migration.bytes": migration.num_bytes,
        "baton.migration.ms": migration.seconds * 1000,
    }


def parent_context(traceparent: object) -> SpanContext | None:
    """The caller's span from a W3C `traceparent` value; None (a new trace) if absent or bad."""
    if not isinstance(traceparent, str) or not traceparent:
        return None
    parent = trace.get_current_span(PROPAGATOR.extract({"traceparent": traceparent}))
    context = parent.get_span_context()
    return context if context.is_valid else None


def otlp_endpoint(url: str) -> str:
    """`http://host:4318` means the collector's standard traces path; a full URL is kept."""
    return url if urlsplit(url).path not in ("", "/") else url.rstrip("/") + OTLP_TRACES_PATH


def exporters_from(settings: ServerSettings) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    if settings.otlp_traces_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter(endpoint=otlp_endpoint(settings.otlp_traces_endpoint)))
    if settings.trace_console:
        exporters.append(ConsoleSpanExporter())
    return exporters


class Tracing:
    """Span trees for the requests that carry a `TraceStart` (the engine request's
    `trace_context`, which the route sets from `start()`), built as each finishes."""

    def __init__(
        self, engine: EngineClient, model_name: str, exporters: list[SpanExporter]
    ) -> None:
        self.model_name = model_name
        self.policy = engine.config.scheduling_policy
        # Processors of its own, not a global provider: several servers may share a process.
        self.processors = SynchronousMultiSpanProcessor()
        for exporter in exporters:
            self.add_exporter(exporter)
        self.resource = Resource.create({"service.name": "baton"})
        self.scope = InstrumentationScope("baton")
        self.ids = RandomIdGenerator()
        clock: Callable[[], float] = engine.clock
        # Engine times are monotonic seconds; spans want epoch nanoseconds.
        self.offset_ns = time.time_ns() - int(clock() * 1e9)
        engine.add_finish_listener(self.on_finish)

    def add_exporter(self, exporter: SpanExporter, *, batch: bool = True) -> None:
        """Batched export runs on the SDK's thread; unbatched (tests) exports as a span ends."""
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.processors.add_span_processor(processor)

    def start(self, operation: str, traceparent: object = None) -> TraceStart:
        """The trace context for an engine request: its finish will make a span tree."""
        return TraceStart(operation, parent_context(traceparent))

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporters."""
        self.processors.shutdown()

    def on_finish(self, request: Request, output: RequestOutput) -> None:
        start = request.trace_context
        if not isinstance(start, TraceStart):
            return
        try:
            self._record(request, output, start)
        except Exception:
            # A listener must not raise into the step thread; a lost span is only logged.
            logger.exception("could not record the trace of request %s", request.request_id)

    def _ns(self, engine_time: float) -> int:
        return int(engine_time * 1e9) + self.offset_ns

    def _record(self, request: Request, output: RequestOutput, start: TraceStart) -> None:
        timing = output.timing or RequestTiming.of(request)
        arrival = request.arrival_time
        finish = request.finish_time if request.finish_time is not None else arrival
        trace_id = start.parent.trace_id if start.parent else self.ids.generate_trace_id()
        root = self._context(trace_id)
        queue_end = request.first_scheduled_time
        self._span("queue", root, arrival, queue_end if queue_end is not None else finish)
        first_preemption = request.preempted_times[0] if request.preempted_times else None
        for chunk_start, chunk_end, num_tokens in request.prefill_chunks:
            recompute = first_preemption is not None and chunk_start >= first_preemption
            attributes = {"baton.prefill.tokens": num_tokens, "baton.prefill.recompute": recompute}
            self._span("prefill", root, chunk_start, chunk_end, attributes)
        hand_off = start.hand_off
        decode_start = request.first_token_time
        if hand_off is not None:
            transfer = {
                "baton.kv_transfer.bytes": hand_off.num_bytes,
                "baton.prefill_replica": hand_off.prefill_replica,
                "baton.decode_replica": hand_off.decode_replica,
            }
            self._span("kv_transfer", root, hand_off.started, hand_off.finished, transfer)
            decode_start = hand_off.finished
        if decode_start is not None:
            attributes = {"baton.decode.tokens": max(0, request.num_output_tokens - 1)}
            self._span("decode", root, decode_start, finish, attributes)
        migration = start.migration
        if migration is not None:
            moved = _migration_attributes(migration)
            self._span("migration", root, migration.started, migration.finished, moved)
        events = [Event("preempted", timestamp=self._ns(t)) for t in request.preempted_times]
        events += [Event("resumed", timestamp=self._ns(t)) for t in request.resumed_times]
        status = Status(StatusCode.UNSET)
        if request.finish_reason is FinishReason.ERROR:
            message = output.error_detail or output.error or "the request failed inside the engine"
            events.append(Event("exception", {"exception.message": message}, self._ns(finish)))
            status = Status(StatusCode.ERROR, message)
        name = f"{start.operation} {self.model_name}"
        attributes = self._attributes(request, timing, start.operation)
        if hand_off is not None:
            attributes["baton.prefill_replica"] = hand_off.prefill_replica
            attributes["baton.decode_replica"] = hand_off.decode_replica
            attributes["baton.kv_transfer.bytes"] = hand_off.num_bytes
            attributes["baton.kv_transfer.ms"] = hand_off.seconds * 1000
        if migration is not None:
            attributes.update(_migration_attributes(migration))
        self._end(
            ReadableSpan(
                name,
                root,
                start.parent,
                self.resource,
                attributes,
                events,
                kind=SpanKind.SERVER,
                status=status,
                start_time=self._ns(arrival),
                end_time=self._ns(finish),
                instrumentation_scope=self.scope,
            )
        )

    def _context(self, trace_id: int) -> SpanContext:
        return SpanContext(trace_id, self.ids.generate_span_id(), False, SAMPLED)

    def _span(
        self,
        name: str,
        parent: SpanContext,
        begin: float,
        end: float,
        attributes: dict[str, int | float | bool] | None = None,
    ) -> None:
        self._end(
            ReadableSpan(
                name,
                self._context(parent.trace_id),
                parent,
                self.resource,
                attributes or {},
                start_time=self._ns(begin),
                end_time=self._ns(end),
                instrumentation_scope=self.scope,
            )
        )

    def _end(self, span: ReadableSpan) -> None:
        self.processors.on_end(span)

    def _attributes(
        self, request: Request, timing: RequestTiming, operation: str
    ) -> dict[str, object]:
        params = request.sampling_params
        reason = request.finish_reason.value if request.finish_reason else "error"
        attributes: dict[str, object] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": self.model_name,
            "gen_ai.response.id": request.request_id,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.usage.input_tokens": request.num_prompt_tokens,
            "gen_ai.usage.output_tokens": request.num_output_tokens,
            "gen_ai.response.finish_reasons": (reason,),
            "baton.policy": self.policy,
            "baton.priority": request.priority,
            "baton.preemptions": timing.preemptions,
            "baton.cached_prompt_tokens": timing.cached_prompt_tokens,
        }
        if params.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = params.max_tokens
        if request.first_scheduled_time is not None:
            attributes["baton.queue_ms"] = timing.queue_ms
        if request.first_token_time is not None:
            attributes["baton.ttft_ms"] = timing.ttft_ms
        if request.num_output_tokens > 1:
            attributes["baton.tpot_ms"] = timing.tpot_ms
            gaps = sorted(token_gaps(request.token_times))
            attributes["baton.itl_p99_ms"] = (percentile(gaps, 99) or 0.0) * 1e3
        met = slo_outcome(request, timing).met
        if met is not None:
            attributes["baton.slo.met"] = met
        if request.drafts.num_draft_tokens:
            attributes["baton.spec_decode.draft_tokens"] = request.drafts.num_draft_tokens
            attributes["baton.spec_decode.accepted_tokens"] = request.drafts.num_accepted_tokens
        return attributes
