"""What an operator reads: Prometheus metrics, the `/v1/stats` snapshot, per-request OpenTelemetry
tracing.
"""
