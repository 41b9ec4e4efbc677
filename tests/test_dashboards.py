"""Baton's own Grafana dashboard (dashboards/): every PromQL expression in it names series a
live `/metrics` scrape exports, and it covers what an operator of an SLO-aware server watches,
each engine replica included (a single-process server is replica "0")."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.promql import dashboard_queries, exposed, label_values_queries, metric_names
from tests.server_harness import base_url, running_server, simulated_engine

DASHBOARDS = sorted((Path(__file__).parent.parent / "dashboards").glob("*.json"))
# Labels Prometheus adds to every series it scrapes, not part of /metrics.
TARGET_LABELS = {"instance", "job"}


@pytest.fixture(scope="module")
def scrape(llama_checkpoint) -> str:
    with running_server(simulated_engine(llama_checkpoint)) as state:
        url = base_url(state)
        body = {"prompt": "grafana", "max_tokens": 4, "slo": {"ttft_ms": 60_000}}
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
        return httpx.get(f"{url}/metrics").text


def test_the_dashboard_folder_holds_batons_dashboard():
    assert [p.name for p in DASHBOARDS] == ["baton.json"]


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda p: p.stem)
def test_every_expression_names_a_series_metrics_exports(scrape, dashboard):
    names = exposed(scrape)
    expressions, templates = dashboard_queries(dashboard)
    for expression in expressions:
        queried = metric_names(expression)
        assert queried, f"names no metric: {expression}"
        assert queried <= set(names), f"{sorted(queried - set(names))} in {expression}"
    for metric, label in label_values_queries(templates):
        assert metric in names
        assert label in TARGET_LABELS | names[metric]


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda p: p.stem)
def test_the_dashboard_shows_latency_slo_goodput_queue_kv_and_steps(dashboard):
    expressions, _ = dashboard_queries(dashboard)
    queried = set().union(*(metric_names(e) for e in expressions))
    for name in (
        "baton:time_to_first_token_seconds_bucket",
        "baton:request_time_per_output_token_seconds_bucket",
        "baton:slo_attained_total",
        "baton:slo_missed_total",
        "baton:request_goodput_total",
        "baton:num_requests_waiting_by_priority",
        "baton:kv_cache_usage_perc",
        "baton:step_duration_seconds_bucket",
    ):
        assert name in queried
    panels = json.loads(dashboard.read_text())["panels"]
    assert all(p["type"] == "timeseries" and p["targets"] for p in panels)
    assert len({p["id"] for p in panels}) == len(panels)


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda p: p.stem)
def test_the_dashboard_shows_each_replica(dashboard):
    expressions, templates = dashboard_queries(dashboard)
    per_replica = [e for e in expressions if "baton:replica_" in e]
    queried = set().union(*(metric_names(e) for e in per_replica))
    for name in (
        "baton:replica_healthy",
        "baton:replica_num_requests_running",
        "baton:replica_num_requests_waiting",
        "baton:replica_kv_cache_usage_perc",
        "baton:replica_requests_routed_total",
        "baton:replica_requests_finished_total",
        "baton:replica_prefix_cache_hits_total",
    ):
        assert name in queried
    # One line per replica, and the panels follow the replica picker.
    assert all("by(replica)" in e and 'replica=~"$replica"' in e for e in per_replica)
    assert ("baton:replica_healthy", "replica") in set(label_values_queries(templates))
