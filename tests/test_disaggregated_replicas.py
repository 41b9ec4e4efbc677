"""`baton serve --replicas 2 --prefill-replicas 1 --disaggregate always` on a local Ray: each
request is prefilled on replica 0, its KV moved through Ray's object store to replica 1, and
streamed on from there with the tokens, text and usage of one process. Faults end in a retry or
a clean error for that request only, with the KV blocks on both sides freed: a transfer whose
KV cannot be written, KV lost with the prefill replica that owned it, a prefill replica that
hangs mid-prompt (its request retried whole on the decode replica), and a decode replica that
dies mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import httpx
import numpy as np
import pytest

# scripts/setup installs the ray extra: without it these tests fail, they are not skipped.
import ray

from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from tests.server_harness import model_engine, served_replicas

# A prefill chunk of 64 tokens: the longest prompt takes three steps on the prefill replica.
ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "num_kv_blocks": 256}
PROMPTS = [[1, 17, 42, 99, 7, 3 + i] for i in range(3)] + [[(11 * j) % 400 + 5 for j in range(150)]]
PREFILL, DECODE = 0, 1
# Never met, it holds back the end of the text at every step: the first token's text, held on
# the prefill replica, must come out of the decode replica once.
STOP = ["~~~"]


@pytest.fixture(scope="module")
def served(llama_checkpoint):
    """One prefill and one decode replica behind a front end on loopback; yields (url, engine,
    spans)."""
    with served_replicas(
        llama_checkpoint, ENGINE, DisaggregationSettings(prefill_replicas=1, disaggregate="always")
    ) as served:
        yield served


@pytest.fixture(scope="module")
def expected(llama_checkpoint) -> list[tuple[str, int]]:
    """Each prompt's greedy text and token count from one in-process engine."""
    engine = model_engine(llama_checkpoint, **ENGINE)
    for index, prompt in enumerate(PROMPTS):
        spec = _request(str(index), prompt, 12)
        engine.add_request(engine.validator.validate(spec))
    texts = {str(i): "" for i in range(len(PROMPTS))}
    counts = dict.fromkeys(texts, 0)
    while engine.has_unfinished_requests:
        for output in engine.step():
            texts[output.request_id] += output.new_text
            counts[output.request_id] += len(output.new_token_ids)
    return [(texts[str(i)], counts[str(i)]) for i in range(len(PROMPTS))]


def _request(request_id: str, prompt: list[int], max_tokens: int):
    from tests.factory import make_request

    return make_request(
        request_id, prompt, max_tokens=max_tokens, ignore_eos=True, temperature=0, stop=STOP
    )


async def _stream(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int = 12):
    """One streamed completion: ('done', text, completion tokens) or ('error', message, 0)."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stop": STOP,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text = ""
    async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "error", chunk["error"]["message"], 0
            if chunk.get("usage"):
                return "done", text, chunk["usage"]["completion_tokens"]
            text += chunk["choices"][0]["text"]
    return "cut", text, 0


def _run(url: str, prompts: list[list[int]], max_tokens: int = 12) -> list[tuple]:
    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(_stream(client, url, p, max_tokens) for p in prompts))

    return asyncio.run(run())


def _settled(engine) -> None:
    """Wait until both replicas are serving, idle, and hold no KV block."""
    deadline = time.monotonic() + 60
    while not all(
        ledger.healthy and ledger.stats.kv_cache_usage == 0 and ledger.stats.num_running == 0
        for ledger in engine.ledgers
    ):
        assert time.monotonic() < deadline, [ledger.stats for ledger in engine.ledgers]
        time.sleep(0.2)
    assert engine.num_in_flight == 0


def test_split_requests_stream_the_tokens_of_one_process(served, expected):
    url, engine, spans = served
    before = engine.hand_offs.total
    got = _run(url, PROMPTS)
    assert [(text, count) for _, text, count in got] == expected
    assert all(kind == "done" for kind, _, _ in got)
    # Every one prefilled on the prefill replica and moved: none failed, none decoded there.
    total = engine.hand_offs.total
    assert (total.count - before.count, total.failed) == (len(PROMPTS), 0)
    assert total.num_bytes - before.num_bytes >= 150 * engine.infos[0].kv_bytes_per_token
    assert engine.ledgers[PREFILL].num_finished == 0
    # Placement weighs the link as measured.
    assert engine.hand_offs.link.num_observations >= len(PROMPTS)
    assert engine.placement.transfer == engine.hand_offs.link.current != engine.hand_offs.link.prior
    _settled(engine)
    # The trace names both replicas and the transfer; the prompt's chunks came with it.
    roots = [s for s in spans.get_finished_spans() if s.name == "text_completion tiny"]
    long_root = next(s for s in roots if s.attributes["gen_ai.usage.input_tokens"] == 150)
    assert long_root.attributes["baton.prefill_replica"] == PREFILL
    assert long_root.attributes["baton.decode_replica"] == DECODE
    assert long_root.attributes["baton.kv_transfer.bytes"] > 0
    children = [
        s
        for s in spans.get_finished_spans()
        if s.parent and s.parent.span_id == long_root.context.span_id
    ]
    assert sorted(s.name for s in children) == [
        "decode",
        "kv_transfer",
        "prefill",
        "prefill",
        "prefill",
        "queue",
    ]
    stats = httpx.get(f"{url}/v1/stats").json()
    assert [r["role"] for r in stats["replicas"]] == ["prefill", "decode"]
    # Counted where they were received: the decode replica.
    assert [r["kv_transfers"]["count"] for r in stats["replicas"]] == [0, total.count]
    assert stats["kv_transfers"]["bytes"] == total.num_bytes
    metrics = httpx.get(f"{url}/metrics").text
    assert 'baton:replica_healthy{replica="0",role="prefill"} 1.0' in metrics
    received = float(stats["replicas"][DECODE]["kv_transfers"]["count"])
    assert f'baton:replica_kv_transfers_total{{replica="1",role="decode"}} {received}' in metrics


def test_a_transfer_that_cannot_be_written_fails_only_its_request(served, expected, monkeypatch):
    url, engine, _ = served
    move = engine.hand_offs.move

    async def move_garbage(prefilled, kv, source, target, timeout_s):
        # The decode replica is handed contents that do not fit its cache: its write fails.
        return await move(prefilled, ray.put(np.zeros(3, np.uint8)), source, target, timeout_s)

    monkeypatch.setattr(engine.hand_offs, "move", move_garbage)
    (result,) = _run(url, PROMPTS[3:])
    assert result[0] == "error" and "moving this request" in result[1]
    assert engine.hand_offs.total.failed == 1
    # Nothing hangs and neither side keeps a block of it.
    _settled(engine)
    monkeypatch.undo()
    assert _run(url, PROMPTS[:1])[0][1:] == expected[0]


def test_a_hand_off_that_raises_fails_only_its_request(served, expected, monkeypatch):
    url, engine, _ = served
    choose = engine.placement.hand_off

    def raise_for_the_long_prompt(request_id, num_prompt_tokens, *args):
        # A bug in placing one request: it used to end the task reading the prefill replica's
        # steps, so every later request through that replica hung without a word in the log.
        if num_prompt_tokens == len(PROMPTS[3]):
            raise RuntimeError("a bug in placement")
        return choose(request_id, num_prompt_tokens, *args)

    monkeypatch.setattr(engine.placement, "hand_off", raise_for_the_long_prompt)
    short, long = _run(url, [PROMPTS[0], PROMPTS[3]])
    monkeypatch.undo()
    assert short[1:] == expected[0]
    assert long[0] == "error" and "internal error" in long[1]
    _settled(engine)
    assert [result[1:] for result in _run(url, PROMPTS[2:])] == expected[2:]


def test_a_placement_that_raises_leaves_no_request_registered(served, expected, monkeypatch):
    url, engine, _ = served

    def broken_route(request, now):
        raise RuntimeError("a bug in placement")

    monkeypatch.setattr(engine.placement, "route", broken_route)
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 4})
    monkeypatch.undo()
    assert reply.status_code == 500
    # Its stream would otherwise hold a place in the queue limit for ever.
    assert engine.num_in_flight == 0
    assert _run(url, PROMPTS[:1])[0][1:] == expected[0]


def test_a_move_that_raises_fails_only_its_request(served, expected, monkeypatch):
    url, engine, _ = served

    async def broken_move(prefilled, kv, source, target, timeout_s):
        raise RuntimeError("a bug in the move")

    monkeypatch.setattr(engine.hand_offs, "move", broken_move)
    (result,) = _run(url, PROMPTS[3:])
    monkeypatch.undo()
    assert result[0] == "error" and "moving this request" in result[1]
    _settled(engine)
    assert _run(url, PROMPTS[:1])[0][1:] == expected[0]


def test_kv_lost_with_its_prefill_replica_fails_only_that_request(served, expected, monkeypatch):
    url, engine, _ = served
    move = engine.hand_offs.move

    async def owner_dies_first(prefilled, kv, source, target, timeout_s):
        # The KV's owner, the prefill replica, is dead before the decode replica reads it.
        # Ray knows it once the front end has seen it back in a new process.
        pid = engine.infos[source].pid
        ray.kill(engine.actors[source], no_restart=False)
        while engine.infos[source].pid == pid:
            await asyncio.sleep(0.02)
        return await move(prefilled, kv, source, target, timeout_s)

    monkeypatch.setattr(engine.hand_offs, "move", owner_dies_first)
    (result,) = _run(url, PROMPTS[1:2])
    monkeypatch.undo()
    assert result[0] == "error" and "moving this request" in result[1]
    # Restarted, it prefills again; the decode replica's blocks are all free.
    _settled(engine)
    assert _run(url, PROMPTS[1:2])[0][1:] == expected[1]


def test_a_prefill_replica_hung_mid_prompt_has_its_request_retried_whole(served, expected):
    url, engine, _ = served
    pid = engine.infos[PREFILL].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # Routed to the hung prefill replica, it sends nothing within --replica-stall-timeout:
        # it runs on the decode replica instead, and the client sees nothing of it.
        (result,) = _run(url, PROMPTS[3:])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert result[1:] == expected[3]
    _settled(engine)
    assert engine.infos[PREFILL].pid != pid


def test_a_decode_replica_that_dies_after_the_transfer_fails_only_its_request(served):
    url, engine, _ = served

    async def kill_mid_stream():
        async with httpx.AsyncClient(timeout=60) as client:
            moved = engine.hand_offs.total.count
            task = asyncio.create_task(_stream(client, url, PROMPTS[0], max_tokens=400))
            deadline = time.monotonic() + 60
            while engine.hand_offs.total.count == moved:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            ray.kill(engine.actors[DECODE], no_restart=False)
            return await task

    kind, message, _ = asyncio.run(kill_mid_stream())
    assert kind == "error" and "replica serving this request stopped" in message
    _settled(engine)
    assert _run(url, PROMPTS[:1])[0][0] == "done"
