"""`--metrics-style vllm`: the series Baton measures under vLLM's names, labels and label values,
checked against the Grafana dashboards vLLM publishes (tests/data/vllm_dashboards, copied from
vLLM 0.33.0): every series they query is on a live `/metrics` scrape."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from baton.app.engine.async_engine import AsyncEngine
from baton.app.observability.prometheus import SERIES, ServerMetrics
from baton.core.request import FinishReason
from tests.factory import make_engine
from tests.promql import dashboard_queries, exposed, label_values_queries, metric_names
from tests.server_harness import base_url, running_server, simulated_engine

VLLM_DASHBOARDS = sorted((Path(__file__).parent / "data" / "vllm_dashboards").glob("*.json"))
# vLLM's finish reasons (vllm/v1/engine FINISH_REASON_STRINGS).
VLLM_FINISHED_REASONS = {"stop", "length", "abort", "error", "repetition"}


def served_scrape(checkpoint: Path, style: str) -> str:
    """/metrics after two finished requests on a server with `--metrics-style style`."""
    with running_server(simulated_engine(checkpoint), "tiny", metrics_style=style) as state:
        url = base_url(state)
        for max_tokens in (3, 5):
            body = {"prompt": "dashboards", "max_tokens": max_tokens, "ignore_eos": True}
            assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
        return httpx.get(f"{url}/metrics").text


@pytest.fixture(scope="module")
def vllm_scrape(llama_checkpoint) -> str:
    return served_scrape(llama_checkpoint, "vllm")


@pytest.fixture(scope="module")
def both_scrape(llama_checkpoint) -> str:
    return served_scrape(llama_checkpoint, "both")


def test_the_fixtures_are_vllms_dashboards():
    assert [p.name for p in VLLM_DASHBOARDS] == [
        "grafana.json",
        "performance_statistics.json",
        "query_statistics.json",
    ]
    expressions, _ = dashboard_queries(VLLM_DASHBOARDS[0])
    assert len(expressions) > 30
    assert "vllm:request_prompt_tokens_bucket" in metric_names(
        'sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name="$m"}[$__range]))'
    )


@pytest.mark.parametrize("dashboard", VLLM_DASHBOARDS, ids=lambda p: p.stem)
def test_every_series_vllms_dashboard_queries_is_on_metrics(vllm_scrape, dashboard):
    names = exposed(vllm_scrape)
    expressions, templates = dashboard_queries(dashboard)
    queried = set().union(*(metric_names(e) for e in expressions))
    assert queried, "the dashboard's expressions name no metric"
    assert queried <= set(names), f"missing on /metrics: {sorted(queried - set(names))}"
    # The dashboards pick the model from label_values(model_name) and filter every panel by it.
    for metric, label in label_values_queries(templates):
        carriers = [names[metric]] if metric else list(names.values())
        assert any(label in labels for labels in carriers), (metric, label)


def test_vllm_series_carry_the_model_name_and_vllms_finish_reasons(vllm_scrape):
    families = {f.name: f for f in text_string_to_metric_families(vllm_scrape)}
    for name, family in families.items():
        if name.startswith("vllm:"):
            for sample in family.samples:
                assert sample.labels["model_name"] == "tiny", sample
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert {"stop", "length", "abort"} <= reasons <= VLLM_FINISHED_REASONS
    length = [
        s.value
        for s in families["vllm:request_success"].samples
        if s.labels["finished_reason"] == "length"
    ]
    assert length == [2]


def test_vllm_style_drops_only_the_baton_names_vllm_has_its_own_for(vllm_scrape):
    names = exposed(vllm_scrape)
    assert "baton:time_to_first_token_seconds_count" not in names
    assert "vllm:time_to_first_token_seconds_count" in names
    # What only Baton measures keeps its name, so switching styles loses nothing.
    assert {"baton:slo_attained_total", "baton:step_duration_seconds_count"} <= set(names)


def test_both_styles_report_the_same_observations(both_scrape):
    samples: dict = {}
    for family in text_string_to_metric_families(both_scrape):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
            # Baton's cancelled and refused are both vLLM's abort.
            if labels.get("finished_reason") in ("cancelled", "refused"):
                labels["finished_reason"] = "abort"
            key = (sample.name, tuple(sorted(labels.items())))
            samples[key] = samples.get(key, 0) + sample.value
    compared = 0
    for series in SERIES:
        for vllm_name in series.vllm:
            for suffix in ("", "_total", "_bucket", "_sum", "_count"):
                ours = {
                    k[1]: v for k, v in samples.items() if k[0] == f"baton:{series.name}{suffix}"
                }
                theirs = {
                    k[1]: v for k, v in samples.items() if k[0] == f"vllm:{vllm_name}{suffix}"
                }
                assert ours == theirs, (series.name, vllm_name, suffix)
                compared += len(ours)
    assert compared > 100
    assert samples[("vllm:generation_tokens_total", ())] == 3 + 5


def test_cancelled_and_refused_requests_count_as_vllms_abort():
    engine = AsyncEngine(make_engine(), max_queued_requests=4)
    metrics = ServerMetrics(engine, model_name="m", style="vllm")
    metrics.aggregates.finished_by_reason[FinishReason.CANCELLED] = 2
    metrics.aggregates.finished_by_reason[FinishReason.REFUSED] = 3
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    by_reason = {
        s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples
    }
    assert by_reason["abort"] == 2 + 3
    assert "cancelled" not in by_reason and "refused" not in by_reason


def test_an_unknown_metrics_style_is_refused_naming_the_choices():
    from baton.app.settings import ServerSettings

    with pytest.raises(ValueError, match="--metrics-style must be one of baton, vllm, both"):
        ServerSettings(metrics_style="prometheus")
