"""`baton serve --replicas N` on a local Ray (two CPUs, loopback, no dashboard) with two
replicas of a tiny model: greedy outputs equal the single-process server's; each router
spreads requests as documented; a shared prefix under `prefix` hits one replica's cache; a
replica killed under load fails only its own requests, cleanly, and comes back. And
`--replicas 1` never imports Ray."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

# scripts/setup installs the ray extra: without it these tests fail, they are not skipped.
import ray

from baton.app.settings import ServerSettings
from baton.core.config import EngineConfig
from baton.core.replicas.router import Router
from baton.core.text.tokenizer import Tokenizer
from tests.server_harness import (
    base_url,
    free_port,
    model_engine,
    running_server,
    wait_until_healthy,
)

ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "num_kv_blocks": 512}


def test_one_replica_never_imports_ray(tmp_path):
    # The serve path up to loading the model, which fails here: Ray must not be loaded by then.
    code = (
        "import sys; from baton.app.cli import main; "
        f"code = main(['serve', '--model', {str(tmp_path / 'none')!r}, '--port', '0']); "
        "print(code, 'ray' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["2", "False"]


@pytest.fixture(scope="module")
def replicas(llama_checkpoint):
    """Two replicas behind a front end on loopback; yields (state, engine)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from baton.app.replicas.replica_server import start_replicas
    from baton.app.replicas.replica_settings import ReplicaModel, ReplicaSettings
    from tests.server_harness import running_front_end

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = ReplicaModel(
            str(llama_checkpoint),
            EngineConfig(**ENGINE),
            device="cpu",
            profile_step_cost=False,
        )
        engine = start_replicas(
            spec, ReplicaSettings(num_replicas=2, router="round-robin", max_restarts=2), 64
        )
        settings = ServerSettings(port=free_port())
        tokenizer = Tokenizer.from_pretrained(llama_checkpoint)
        spans = InMemorySpanExporter()
        with running_front_end(engine, tokenizer, "tiny", spans, settings) as state:
            state.spans = spans
            yield state, engine
    finally:
        ray.shutdown()


PROMPTS = [[1, 17, 42, 99, 7, 3 + i] for i in range(4)]


def _complete(url: str, prompt: list[int], max_tokens: int = 12) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.slow
def test_greedy_outputs_equal_the_single_process_servers(replicas, llama_checkpoint):
    state, engine = replicas
    with running_server(model_engine(llama_checkpoint, **ENGINE)) as single:
        expected = [_complete(base_url(single), p)["choices"][0]["text"] for p in PROMPTS]
    got = [_complete(base_url(state), p)["choices"][0]["text"] for p in PROMPTS]
    assert got == expected
    # Round-robin: two requests each; every replica's gauges back at zero.
    assert [ledger.num_routed for ledger in engine.ledgers] == [2, 2]
    assert engine.stats.num_running == 0 and engine.num_in_flight == 0
    stats = httpx.get(f"{base_url(state)}/v1/stats").json()
    assert [(r["id"], r["healthy"], r["requests_finished"]) for r in stats["replicas"]] == [
        (0, True, 2),
        (1, True, 2),
    ]
    assert len({r["pid"] for r in stats["replicas"]}) == 2
    # Each request's trace: a server span made in the front end from its replica's record.
    roots = [s for s in state.spans.get_finished_spans() if s.name == "text_completion tiny"]
    assert len(roots) == 4
    assert all(s.attributes["gen_ai.usage.output_tokens"] == 12 for s in roots)
    assert stats["totals"]["requests"] >= 4  # the replicas' finishes reach the metrics
    metrics = httpx.get(f"{base_url(state)}/metrics").text
    assert 'baton:replica_requests_routed_total{replica="1",role="both"} 2.0' in metrics
    assert 'baton:replica_num_requests_running{replica="0",role="both"} 0.0' in metrics
    assert 'baton:replica_requests_finished_total{replica="0",role="both"} 2.0' in metrics
    assert 'baton:replica_healthy{replica="1",role="both"} 1.0' in metrics


@pytest.mark.slow
def test_websocket_requests_stream_from_the_replicas(replicas):
    from websockets.asyncio.client import connect

    state, engine = replicas
    url = f"ws://127.0.0.1:{state.settings.port}/v1/ws"

    async def generate() -> dict[int, list[dict]]:
        frames: dict[int, list[dict]] = {0: [], 1: []}
        async with connect(url) as ws:
            for index in frames:
                request = {"type": "generate", "id": index, "prompt": PROMPTS[index]}
                await ws.send(json.dumps({**request, "max_tokens": 6, "ignore_eos": True}))
            while not all(f and f[-1]["type"] == "done" for f in frames.values()):
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                frames[frame["id"]].append(frame)
        return frames

    before = [ledger.num_routed for ledger in engine.ledgers]
    frames = asyncio.run(generate())
    # Round-robin (the fixture's router): one request on each replica.
    assert [ledger.num_routed - b for ledger, b in zip(engine.ledgers, before, strict=True)] == [
        1,
        1,
    ]
    for request_frames in frames.values():
        assert request_frames[-1]["usage"]["completion_tokens"] == 6
        assert {f["type"] for f in request_frames[:-1]} == {"token"}


@pytest.mark.slow
def test_prefix_router_keeps_a_shared_prefix_on_one_replica(replicas):
    state, engine = replicas
    engine.router = Router("prefix", engine.ledgers, 0.0)
    before = [ledger.num_routed for ledger in engine.ledgers]
    shared = list(range(100, 164))  # four full blocks
    for i in range(4):
        _complete(base_url(state), [*shared, 200 + i, 7], max_tokens=4)
    routed = [ledger.num_routed - b for ledger, b in zip(engine.ledgers, before, strict=True)]
    assert sorted(routed) == [0, 4]
    holder = engine.ledgers[routed.index(4)]
    # The replica's own snapshot: the three requests after the first hit its prefix cache.
    assert holder.stats.prefix_cache_hits >= 3 * len(shared)


async def _stream(client: httpx.AsyncClient, url: str, prompt: list[int], seen: asyncio.Event):
    """One streamed completion: ('done', tokens) or ('error', message)."""
    body = {
        "prompt": prompt,
        "max_tokens": 300,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "error", chunk["error"]["message"]
            seen.set()
            if chunk.get("usage"):
                return "done", chunk["usage"]["completion_tokens"]
    return "cut", None


@pytest.mark.slow
def test_a_killed_replica_fails_only_its_requests_and_rejoins(replicas):
    state, engine = replicas
    engine.router = Router("round-robin", engine.ledgers, 0.0)
    url = base_url(state)

    async def load_and_kill():
        seen = asyncio.Event()
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [
                asyncio.create_task(_stream(client, url, [5, 6, 7, i], seen)) for i in range(6)
            ]
            await asyncio.wait_for(seen.wait(), 60)
            on_victim = len(engine.ledgers[1].request_ids)
            assert on_victim >= 1
            ray.kill(engine.actors[1], no_restart=False)
            return await asyncio.gather(*tasks), on_victim

    results, on_victim = asyncio.run(load_and_kill())
    done = [n for kind, n in results if kind == "done"]
    errors = [message for kind, message in results if kind == "error"]
    # The survivor's three (round-robin) complete in full; of the victim's, each either
    # errors cleanly or, had it sent nothing yet, was retried and completes in full.
    assert len(done) >= 3 and all(n == 300 for n in done)
    assert len(errors) <= on_victim and len(done) + len(errors) == 6
    assert all("replica serving this request stopped" in message for message in errors)
    deadline = time.monotonic() + 90
    while not engine.ledgers[1].healthy:
        assert time.monotonic() < deadline, "the killed replica did not rejoin"
        time.sleep(0.5)
    for prompt in PROMPTS[:2]:
        assert _complete(url, prompt)["usage"]["completion_tokens"] == 12
    assert engine.ledgers[1].num_routed >= 1
    assert engine.stats.num_running == 0 and engine.num_in_flight == 0
    assert httpx.get(f"{url}/health").status_code == 200


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
SHUTDOWN_TIMEOUT_S = 4.0


def _listening_addresses(pid: int) -> set[str]:
    """The addresses every process in `pid`'s tree listens on (Ray's are its children)."""
    root = psutil.Process(pid)
    addresses = set()
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    addresses.add(connection.laddr.ip)
    return addresses


@pytest.mark.slow
def test_baton_serve_keeps_ray_on_loopback_and_restarts_a_hung_replica(llama_checkpoint, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "baton.app.cli", "serve", "--model", str(llama_checkpoint)]
    command += ["--device", "cpu", "--port", str(port), "--replicas", "2"]
    command += ["--router", "round-robin", "--replica-stall-timeout", "3"]
    command += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    stopped = None
    try:
        wait_until_healthy(process, port, log, timeout_s=240)
        url = f"http://127.0.0.1:{port}"
        # Ray's GCS, raylet, workers and agents as well as Baton: nothing beyond loopback.
        addresses = _listening_addresses(process.pid)
        assert addresses and addresses <= LOOPBACK, addresses

        async def load_and_stop():
            seen = [asyncio.Event() for _ in range(4)]
            async with httpx.AsyncClient(timeout=120) as client:
                tasks = [
                    asyncio.create_task(_stream(client, url, [5, 6, 7, i], seen[i]))
                    for i in range(4)
                ]
                # Every stream has sent a token: the hung replica's cannot be retried.
                await asyncio.wait_for(asyncio.gather(*(event.wait() for event in seen)), 60)
                replicas = (await client.get(f"{url}/v1/stats")).json()["replicas"]
                victim = max(replicas, key=lambda r: r["requests_in_flight"])
                os.kill(victim["pid"], signal.SIGSTOP)
                stopped_at = time.monotonic()
                # Sent after the stop: if routed to the hung replica it has sent nothing yet,
                # so it is retried on the other.
                late = asyncio.create_task(_stream(client, url, [9, 9], asyncio.Event()))
                results = await asyncio.gather(*tasks, late)
                return victim, results, time.monotonic() - stopped_at

        victim, results, took_s = asyncio.run(load_and_stop())
        stopped = victim["pid"]
        done = [n for kind, n in results if kind == "done"]
        errors = [message for kind, message in results if kind == "error"]
        # The healthy replica's streams complete; the hung one's end with a clean error
        # (or complete, retried, had they sent nothing), not a frozen stream.
        assert len(done) + len(errors) == 5 and all(n == 300 for n in done)
        assert 1 <= len(errors) <= victim["requests_in_flight"]
        assert all("replica serving this request stopped" in message for message in errors)
        assert took_s < 60
        # Restarted: healthy again in a new process, and serving.
        deadline = time.monotonic() + 120
        while True:
            replicas = httpx.get(f"{url}/v1/stats").json()["replicas"]
            back = replicas[victim["id"]]
            if back["healthy"] and back["pid"] != victim["pid"]:
                break
            assert time.monotonic() < deadline, "the hung replica was not restarted"
            time.sleep(0.5)
        for prompt in PROMPTS[:2]:
            assert _complete(url, prompt)["usage"]["completion_tokens"] == 12
        assert f"engine replica {victim['id']} sent no step for" in log.read_text()
        # SIGTERM with a replica hung again: the server still exits on time, and Ray's
        # processes go with it.
        ray_processes = psutil.Process(process.pid).children(recursive=True)
        stopped = replicas[0]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert process.wait(SHUTDOWN_TIMEOUT_S + 10) == 0, log.read_text()
        assert time.monotonic() - signalled < SHUTDOWN_TIMEOUT_S + 1
        _, alive = psutil.wait_procs(ray_processes, timeout=10)
        assert alive == []
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
            process.wait(60)


@pytest.mark.parametrize(
    ("flags", "confined"),
    [({}, True), ({"ray_all_interfaces": True}, False), ({"ray_address": "10.0.0.5:6379"}, False)],
)
def test_only_a_local_ray_is_kept_on_loopback_unless_asked(monkeypatch, flags, confined):
    from baton.app.replicas.replica_settings import ReplicaSettings

    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    ReplicaSettings(num_replicas=2, **flags).confine_ray()
    assert (os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0") == confined
