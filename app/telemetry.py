"""Per-request OpenTelemetry tracing: one SERVER span per engine request, from arrival to
finish, with child spans for the queue, each prefill chunk and the decode, and events for
preemptions. The engine records its own timestamps as it goes (core/request.py); the span tree
is built once the request has finished, with explicit start and end times converted from the
engine's monotonic clock to epoch nanoseconds by one offset. With no exporter configured none
of this exists: no provider, no listener, no span objects."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.settings import ServerSettings
from core.engine import Engine
from core.metrics import percentile, slo_outcome, token_gaps
from core.outputs import RequestOutput, RequestTiming
from core.request import FinishReason, Request

logger = logging.getLogger("baton.telemetry")
PROPAGATOR = TraceContextTextMapPropagator()
OTLP_TRACES_PATH = "/v1/traces"


@dataclass(slots=True, frozen=True)
class TraceStart:
    """What only the route knows about a request: the API operation and the caller's trace."""

    operation: str
    parent: Context | None


def parent_context(traceparent: object) -> Context | None:
    """The caller's trace from a W3C `traceparent` value; None (a new trace) if absent or bad."""
    if not isinstance(traceparent, str) or not traceparent:
        return None
    context = PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


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
    """Span trees for the requests the routes announce with `expect`, built as each finishes.

    `expect` runs on the event loop and `on_finish` on the step thread; they share one dict,
    whose single-key operations are atomic under the GIL.
    """

    def __init__(self, engine: Engine, model_name: str, exporters: list[SpanExporter]) -> None:
        self.model_name = model_name
        self.policy = engine.config.scheduling_policy
        # A provider of its own, not the global one: several servers may share a process.
        self.provider = TracerProvider(resource=Resource.create({"service.name": "baton"}))
        for exporter in exporters:
            self.add_exporter(exporter)
        self.tracer = self.provider.get_tracer("baton")
        clock: Callable[[], float] = engine.clock
        # Engine times are monotonic seconds; spans want epoch nanoseconds.
        self.offset_ns = time.time_ns() - int(clock() * 1e9)
        self._expected: dict[str, TraceStart] = {}
        engine.finish_listeners.append(self.on_finish)

    def add_exporter(self, exporter: SpanExporter, *, batch: bool = True) -> None:
        """Batched export runs on the SDK's thread; unbatched (tests) exports as a span ends."""
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)

    def expect(self, request_id: str, operation: str, traceparent: object = None) -> None:
        """Announce an engine request about to be submitted, so its finish makes a span."""
        self._expected[request_id] = TraceStart(operation, parent_context(traceparent))

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporters."""
        self.provider.shutdown()

    def on_finish(self, request: Request, output: RequestOutput) -> None:
        start = self._expected.pop(request.request_id, None)
        if start is None:
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
        root = self.tracer.start_span(
            f"{start.operation} {self.model_name}",
            context=start.parent,
            kind=SpanKind.SERVER,
            attributes=self._attributes(request, timing, start.operation),
            start_time=self._ns(arrival),
        )
        context = trace.set_span_in_context(root)
        queue_end = request.first_scheduled_time
        self._child("queue", context, arrival, queue_end if queue_end is not None else finish)
        first_preemption = request.preempted_times[0] if request.preempted_times else None
        for chunk_start, chunk_end, num_tokens in request.prefill_chunks:
            recompute = first_preemption is not None and chunk_start >= first_preemption
            attributes = {"baton.prefill.tokens": num_tokens, "baton.prefill.recompute": recompute}
            self._child("prefill", context, chunk_start, chunk_end, attributes)
        if request.first_token_time is not None:
            decode_tokens = max(0, request.num_output_tokens - 1)
            attributes = {"baton.decode.tokens": decode_tokens}
            self._child("decode", context, request.first_token_time, finish, attributes)
        for when in request.preempted_times:
            root.add_event("preempted", timestamp=self._ns(when))
        for when in request.resumed_times:
            root.add_event("resumed", timestamp=self._ns(when))
        if request.finish_reason is FinishReason.ERROR:
            message = output.error or "the request failed inside the engine"
            root.add_event("exception", {"exception.message": message}, self._ns(finish))
            root.set_status(Status(StatusCode.ERROR, message))
        root.end(end_time=self._ns(finish))

    def _child(
        self,
        name: str,
        context: Context,
        begin: float,
        end: float,
        attributes: dict[str, int | bool] | None = None,
    ) -> None:
        span = self.tracer.start_span(
            name, context=context, attributes=attributes, start_time=self._ns(begin)
        )
        span.end(end_time=self._ns(end))

    def _attributes(
        self, request: Request, timing: RequestTiming, operation: str
    ) -> dict[str, object]:
        params = request.sampling_params
        reason = request.finish_reason.value if request.finish_reason else "error"
        attributes: dict[str, object] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": self.model_name,
            "gen_ai.response.model": self.model_name,
            "gen_ai.response.id": request.request_id,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.usage.input_tokens": request.num_prompt_tokens,
            "gen_ai.usage.output_tokens": request.num_output_tokens,
            "gen_ai.response.finish_reasons": [reason],
            "baton.policy": self.policy,
            "baton.priority": request.priority,
            "baton.preemptions": timing.preemptions,
            "baton.cached_prompt_tokens": timing.cached_prompt_tokens,
            "baton.e2e_ms": timing.e2e_ms,
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
        return attributes
