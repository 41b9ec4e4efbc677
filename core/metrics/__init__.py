"""Latency definitions and the plain-Python aggregates that metrics, stats and tracing read."""
