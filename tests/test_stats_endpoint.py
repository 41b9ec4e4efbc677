"""`GET /v1/stats`: the dashboard's JSON snapshot, empty and after a known workload, and its
API-key protection."""

from __future__ import annotations

import time

import httpx

from tests.server_harness import base_url, running_server, simulated_engine

KEY = "sk-stats"
AUTH = {"Authorization": f"Bearer {KEY}"}


def test_stats_of_an_idle_server_have_nulls_where_the_window_is_empty(llama_checkpoint):
    with running_server(simulated_engine(llama_checkpoint), model_name="tiny") as state:
        stats = httpx.get(f"{base_url(state)}/v1/stats").json()
    assert stats["model"] == "tiny"
    assert stats["running"] == stats["waiting"] == stats["requests_finished"] == 0
    assert stats["kv_cache_usage"] == 0.0
    assert stats["ttft_ms"] == {"p50": None, "p90": None, "p99": None}
    assert stats["tpot_ms"] == {"p50": None, "p90": None, "p99": None}
    assert stats["slo"] == {"attainment": None, "goodput_rps": 0.0}
    assert stats["steps"]["total"] == 0 and stats["steps"]["step_ms_p50"] is None
    assert stats["totals"] == {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
    assert 0 < stats["window_s"] <= 60 and stats["uptime_s"] > 0
    # One engine in this process: one replica, as `--replicas N` lists N.
    [replica] = stats["replicas"]
    assert replica["id"] == 0 and replica["healthy"] is True and replica["running"] == 0


def test_stats_after_a_known_workload(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    with running_server(engine, api_keys=[KEY]) as state:
        url = base_url(state)
        assert httpx.get(f"{url}/v1/stats").status_code == 401
        usages = []
        for index, slo in enumerate(({"ttft_ms": 60_000}, {"tpot_ms": 1e-9}, None, None)):
            body = {"prompt": f"stats {index}", "max_tokens": 4 + index, "ignore_eos": True}
            if slo is not None:
                body["slo"] = slo
            response = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH)
            usages.append(response.json()["usage"])
        stats = httpx.get(f"{url}/v1/stats", headers=AUTH).json()
    generated = sum(u["completion_tokens"] for u in usages)
    prompted = sum(u["prompt_tokens"] for u in usages)
    assert stats["requests_finished"] == 4
    assert stats["totals"] == {
        "requests": 4,
        "prompt_tokens": prompted,
        "generation_tokens": generated,
    }
    window = stats["window_s"]
    throughput = stats["throughput"]
    assert throughput["requests_per_s"] == 4 / window
    assert throughput["generation_tokens_per_s"] == generated / window
    assert throughput["prompt_tokens_per_s"] == prompted / window
    # Two requests had targets: one met, one missed. Goodput counts the met and the target-less.
    assert stats["slo"]["attainment"] == 0.5
    assert stats["slo"]["goodput_rps"] == 3 / window
    ttft = stats["ttft_ms"]
    assert 0 <= ttft["p50"] <= ttft["p90"] <= ttft["p99"]
    assert stats["tpot_ms"]["p50"] is not None
    steps = stats["steps"]
    assert steps["total"] == engine.num_steps > 0
    assert steps["batch_size"] == 1.0  # one request at a time
    assert steps["decode_tokens_per_step"] * engine.num_steps == generated - 4
    assert steps["step_ms_p50"] > 0
    assert stats["policy"] == engine.config.scheduling_policy


def test_pollers_share_one_window_computation_per_refresh(llama_checkpoint):
    from baton.app.observability.stats_endpoint import WINDOW_REFRESH_S

    engine = simulated_engine(llama_checkpoint)
    with running_server(engine) as state:
        url = base_url(state)
        aggregates = state.server.config.app.state.metrics.aggregates
        window = aggregates.window
        calls = []
        aggregates.window = lambda: calls.append(1) or window()
        started = time.monotonic()
        with httpx.Client() as client:
            first = client.get(f"{url}/v1/stats").json()
            body = {"prompt": "poll", "max_tokens": 3, "ignore_eos": True}
            assert client.post(f"{url}/v1/completions", json=body).status_code == 200
            reads = [client.get(f"{url}/v1/stats").json() for _ in range(30)]
        elapsed = time.monotonic() - started
    # The window's aggregates: once per refresh however many reads came in between.
    assert 1 <= len(calls) <= 1 + elapsed / WINDOW_REFRESH_S
    # The engine's published state is read on each request: the finished request shows there.
    assert first["totals"]["requests"] == 0
    assert all(read["totals"]["requests"] == 1 for read in reads)
