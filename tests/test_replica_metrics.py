"""`/metrics`' per-replica series: every one carries a `replica` and a `role` label, and a
single-process server exports them too, as replica "0" of role both, with the same counts as
its own series, so a dashboard's per-replica panels read one server and N replicas alike (N
replicas on Ray: tests/test_replicas.py)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server_harness import base_url, running_server, simulated_engine

PER_REPLICA = (
    "baton:replica_healthy",
    "baton:replica_num_requests_running",
    "baton:replica_num_requests_waiting",
    "baton:replica_kv_cache_usage_perc",
    "baton:replica_requests_routed_total",
    "baton:replica_requests_finished_total",
    "baton:replica_num_preemptions_total",
    "baton:replica_prefix_cache_queries_total",
    "baton:replica_prefix_cache_hits_total",
    "baton:replica_kv_transfers_total",
    "baton:replica_kv_transfers_failed_total",
    "baton:replica_kv_transfer_bytes_total",
    "baton:replica_kv_transfer_seconds_total",
    "baton:replica_migrations_total",
)


def test_a_single_server_is_replica_0_in_every_per_replica_series(llama_checkpoint):
    shared = "a shared opening that fills a block or two of the prefix cache " * 4
    with running_server(simulated_engine(llama_checkpoint)) as state:
        url = base_url(state)
        for index in range(3):
            body = {"prompt": f"{shared}{index}", "max_tokens": 3, "ignore_eos": True}
            assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
        text = httpx.get(f"{url}/metrics").text
    samples = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("baton:")
    }
    replica_series = sorted(name for name in samples if name.startswith("baton:replica_"))
    assert replica_series == sorted(PER_REPLICA)
    assert all(samples[name].labels == {"replica": "0", "role": "both"} for name in PER_REPLICA)

    def value(name: str) -> float:
        return samples[name].value

    assert value("baton:replica_healthy") == 1.0
    assert value("baton:replica_requests_routed_total") == 3.0
    assert value("baton:replica_requests_finished_total") == 3.0
    assert value("baton:replica_num_requests_running") == 0.0
    # The replica's prefix counters are the server's own: one engine, the same snapshot.
    hits = value("baton:replica_prefix_cache_hits_total")
    assert hits == value("baton:prefix_cache_hits_total") > 0
    assert value("baton:replica_prefix_cache_queries_total") == value(
        "baton:prefix_cache_queries_total"
    )
