"""`/metrics` after a known workload, parsed with prometheus-client's own parser: every counter
and histogram adds up to what the clients received."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import websockets
from prometheus_client.parser import text_string_to_metric_families

from tests.server_harness import ControlledExecutor, base_url, running_server, simulated_engine

DESIGN_NAMES = (
    "baton:num_requests_running",
    "baton:num_requests_waiting",
    "baton:kv_cache_usage_perc",
    "baton:time_to_first_token_seconds",
    "baton:inter_token_latency_seconds",
    "baton:e2e_request_latency_seconds",
    "baton:request_queue_time_seconds",
    "baton:num_preemptions",
    "baton:prefix_cache_queries",
    "baton:prefix_cache_hits",
    "baton:prompt_tokens",
    "baton:generation_tokens",
    "baton:request_success",
    "baton:slo_attained",
    "baton:slo_missed",
)


def scrape(url: str) -> dict[str, float]:
    """Every sample, keyed by name and sorted labels: `name{label=value}`."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def family_names(url: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}


async def websocket_requests(url: str, max_tokens: list[int]) -> list[dict]:
    async with websockets.connect(url) as ws:
        for index, count in enumerate(max_tokens):
            frame = {"type": "generate", "id": index, "prompt": f"socket {index}"}
            await ws.send(orjson.dumps({**frame, "max_tokens": count, "ignore_eos": True}).decode())
        done = []
        while len(done) < len(max_tokens):
            frame = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
            if frame["type"] == "done":
                done.append(frame)
        return done


def test_counters_and_histograms_add_up_after_a_known_workload(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    with running_server(engine) as state:
        url = base_url(state)
        assert set(DESIGN_NAMES) <= family_names(url)
        usages = []
        for index, max_tokens in enumerate((3, 7, 12)):
            body = {
                "prompt": f"metrics request number {index}",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                # The first is easy to meet, the second impossible: one attained, one missed.
                "slo": {"ttft_ms": 60_000, "tpot_ms": 1e-9},
            }
            usages.append(httpx.post(f"{url}/v1/completions", json=body).json()["usage"])
        ws_url = f"ws://127.0.0.1:{state.settings.port}/v1/ws"
        done = asyncio.run(websocket_requests(ws_url, [4, 5]))
        usages += [frame["usage"] for frame in done]
        samples = scrape(url)

    received = sum(u["completion_tokens"] for u in usages)
    num_requests = len(usages)
    assert samples["baton:generation_tokens_total"] == received == 3 + 7 + 12 + 4 + 5
    assert samples["baton:prompt_tokens_total"] == sum(u["prompt_tokens"] for u in usages)
    assert samples["baton:request_success_total{finished_reason=length}"] == num_requests
    assert samples["baton:request_success_total{finished_reason=stop}"] == 0
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert samples[f"baton:{name}_seconds_count"] == num_requests
        assert samples[f"baton:{name}_seconds_bucket{{le=+Inf}}"] == num_requests
    # One gap between each pair of consecutive tokens of each request.
    assert samples["baton:inter_token_latency_seconds_count"] == received - num_requests
    assert samples["baton:slo_attained_total{slo=ttft}"] == 3
    assert samples["baton:slo_missed_total{slo=tpot}"] == 3
    assert samples["baton:slo_missed_total{slo=ttft}"] == 0
    # Steps: every prompt token was prefilled or came from the cache, every later token decoded.
    steps = samples["baton:num_steps_total"]
    assert steps == engine.num_steps
    assert samples["baton:step_duration_seconds_count"] == steps
    prefilled = samples["baton:step_prefill_tokens_sum"] + samples["baton:prefix_cache_hits_total"]
    assert prefilled == samples["baton:prompt_tokens_total"]
    assert samples["baton:step_decode_tokens_sum"] == received - num_requests
    assert samples["baton:num_requests_running"] == 0
    assert samples["baton:num_preemptions_total"] == 0
    assert samples["baton:kv_growth_holds_total"] == 0


async def refused_over_socket(url: str, body: dict) -> dict:
    async with websockets.connect(url) as ws:
        await ws.send(orjson.dumps({"type": "generate", "id": 1, **body}).decode())
        return orjson.loads(await asyncio.wait_for(ws.recv(), 10))


def test_queue_depth_by_priority_and_admission_rejections(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint, max_num_seqs=1)
    executor = ControlledExecutor(4096, 16, engine.vocab_size)
    engine.executor = executor
    with running_server(engine, max_queued_requests=2) as state:
        url = base_url(state)
        executor.running.clear()
        # Long enough that the first request still runs when the others have joined the queue.
        body = {"prompt": "held", "max_tokens": 8, "ignore_eos": True}
        threads = [
            threading.Thread(
                target=httpx.post,
                args=(f"{url}/v1/completions",),
                kwargs={"json": {**body, "priority": priority}, "timeout": 30},
            )
            for priority in (0, 0, 5)
        ]
        for thread in threads:
            thread.start()
        while state.engine.num_in_flight < 3:
            pass
        refused = httpx.post(f"{url}/v1/completions", json=body)
        ws_url = f"ws://127.0.0.1:{state.settings.port}/v1/ws"
        refused_frame = asyncio.run(refused_over_socket(ws_url, body))
        # The gauges read the snapshot the step loop publishes after each iteration.
        while state.engine.stats.num_waiting < 2:
            time.sleep(0.01)
        samples = scrape(url)
        executor.running.set()
        for thread in threads:
            thread.join()
    assert refused.status_code == 429
    assert refused_frame["error"]["type"] == "rate_limit_error"
    assert samples["baton:admission_rejections_total"] == 2
    assert samples["baton:num_requests_running"] == 1
    waiting = {k: v for k, v in samples.items() if k.startswith("baton:num_requests_waiting_by")}
    assert sum(waiting.values()) == 2
    assert set(waiting) <= {
        "baton:num_requests_waiting_by_priority{priority=0}",
        "baton:num_requests_waiting_by_priority{priority=5}",
    }
