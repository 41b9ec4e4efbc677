"""Spans leave over OTLP/HTTP: a local receiver started by the test collects what the server's
exporter POSTs to /v1/traces and decodes it with the OTLP protobuf definitions."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.server_harness import base_url, running_server, simulated_engine


class Receiver(BaseHTTPRequestHandler):
    requests: list[tuple[str, ExportTraceServiceRequest]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.requests.append((self.path, message))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_spans_are_exported_to_an_otlp_http_receiver(llama_checkpoint):
    received: list[tuple[str, ExportTraceServiceRequest]] = []
    handler = type("CollectingReceiver", (Receiver,), {"requests": received})
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    try:
        engine = simulated_engine(llama_checkpoint)
        with running_server(engine, otlp_traces_endpoint=endpoint) as state:
            body = {"prompt": "exported", "max_tokens": 3, "ignore_eos": True}
            response = httpx.post(f"{base_url(state)}/v1/completions", json=body, timeout=30)
            assert response.status_code == 200
        # Leaving the server flushed the batch processor.
    finally:
        receiver.shutdown()
    assert received and {path for path, _ in received} == {"/v1/traces"}
    spans = [
        span
        for _, message in received
        for resource_spans in message.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    by_name = {span.name: span for span in spans}
    root = by_name["text_completion tiny"]
    assert {"queue", "prefill", "decode"} <= set(by_name)
    assert all(by_name[n].parent_span_id == root.span_id for n in ("queue", "prefill", "decode"))
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["gen_ai.usage.output_tokens"].int_value == 3
    assert attributes["gen_ai.request.model"].string_value == "tiny"
    resource = received[0][1].resource_spans[0].resource
    service = {a.key: a.value.string_value for a in resource.attributes}
    assert service["service.name"] == "baton"
