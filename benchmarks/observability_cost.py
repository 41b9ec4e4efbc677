"""What observability costs per finished request, without a server: the metrics aggregates'
finish listener, building the request's span tree, and encoding those spans for OTLP (the
standard exporter's encoder, which runs on the span processor's thread).

    python benchmarks/observability_cost.py --output-tokens 256 --requests 2000
"""

from __future__ import annotations

import argparse
import json
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from baton.app.observability.telemetry import Tracing
from baton.core.config import EngineConfig
from baton.core.metrics.metric_aggregates import EngineMetrics
from baton.core.outputs import RequestOutput, RequestTiming
from baton.core.request import FinishReason, Request
from baton.core.sampling_params import SamplingParams


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans = []

    def export(self, spans) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class Listeners:
    """Just enough of an engine for tracing to attach to."""

    config = EngineConfig()
    clock = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self.finish_listeners = []

    def add_finish_listener(self, listener) -> None:
        self.finish_listeners.append(listener)


def finished_request(num_prompt: int, num_output: int) -> tuple[Request, RequestOutput]:
    """A request as the engine leaves it: one prefill chunk, a token every 10 ms."""
    request = Request("r", list(range(num_prompt)), SamplingParams(max_tokens=num_output), 0.0)
    request.first_scheduled_time = 0.001
    request.num_cached_tokens = 0
    request.prefill_chunks = [(0.001, 0.002, num_prompt)]
    request.token_times = [0.002 + i * 0.01 for i in range(num_output)]
    request.first_token_time = request.token_times[0]
    request.token_ids += list(range(num_output))
    request.finish_time = request.token_times[-1]
    request.finish_reason = FinishReason.LENGTH
    output = RequestOutput("r", [], "", num_prompt, num_output, True, FinishReason.LENGTH)
    output.timing = RequestTiming.of(request)
    return request, output


def per_request_us(work, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        work()
    return round((time.perf_counter() - start) / count * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    request, output = finished_request(args.prompt_tokens, args.output_tokens)

    metrics = EngineMetrics()
    metrics_us = per_request_us(lambda: metrics.on_finish(request, output), args.requests)

    tracing = Tracing(Listeners(), "sim", [])
    kept = Keep()
    tracing.add_exporter(kept, batch=False)

    def trace() -> None:
        request.trace_context = tracing.start("text_completion")
        tracing.on_finish(request, output)

    tracing_us = per_request_us(trace, args.requests)
    per_request = len(kept.spans) // args.requests
    batches = [kept.spans[i : i + 512] for i in range(0, len(kept.spans), 512)]
    start = time.perf_counter()
    for batch in batches:
        encode_spans(batch).SerializePartialToString()
    encode_us = round((time.perf_counter() - start) / args.requests * 1e6, 1)
    result = {
        "output_tokens": args.output_tokens,
        "spans_per_request": per_request,
        "metrics_finish_us": metrics_us,
        "span_tree_us": tracing_us,
        "otlp_encode_us": encode_us,
        "total_us_per_output_token": round(
            (metrics_us + tracing_us + encode_us) / args.output_tokens, 2
        ),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
