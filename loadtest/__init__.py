"""Locust load tests for Baton and any OpenAI-compatible server: users, workloads and shapes."""
