"""The server comes up on a real uvicorn, reports health, lists the model and exposes the
gauges other tools read."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server_harness import base_url, running_server, simulated_engine


def test_health_models_and_metrics(llama_checkpoint):
    with running_server(simulated_engine(llama_checkpoint), model_name="tiny") as state:
        url = base_url(state)
        assert httpx.get(f"{url}/health").status_code == 200
        listing = httpx.get(f"{url}/v1/models").json()
        assert [m["id"] for m in listing["data"]] == ["tiny"]
        families = {
            f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        }
        for name in (
            "baton:num_requests_running",
            "baton:num_requests_waiting",
            "baton:kv_cache_usage_perc",
        ):
            assert families[name].samples[0].value == 0.0
        missing = httpx.get(f"{url}/v1/nothing")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
    assert not state.engine.healthy
