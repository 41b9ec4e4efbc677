"""Soak test: thousands of mixed requests against a `baton serve` child (SSE and whole
responses, WebSocket sessions and cancels, clients that hang up, bad and extreme inputs), then
5xx, 4xx by input, RSS growth, open fds, and whether the running/waiting gauges drain to 0.

    python benchmarks/soak.py --requests 5000 --concurrency 16 --json soak.json
    python benchmarks/soak.py --duration 3600 -- --max-queued-requests 64

Flags after `--` go to `baton serve` as they are. Exits 1 on any 5xx (an error event inside a
200 stream counts as one), any valid request that did not finish, gauges left above 0, or an
ERROR entry in the server's log (a 5xx answered to a client already gone shows only there).
A bad input answered 2xx is reported as a finding; an extreme but well-typed value may get 2xx
or 4xx, never 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets

from baton.app.commands.bench import WORDS

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
GAUGES = ("baton:num_requests_running", "baton:num_requests_waiting")

# An outcome is an HTTP status as text, or one of these.
HUNG_UP = "hung-up"  # the client left on purpose
ERROR_EVENT = "error-event"  # a 200 stream that ends in an error event: a 5xx in disguise
INCOMPLETE = "incomplete"  # no [DONE], a choice without finish_reason, a token frame skipped
MALFORMED = "malformed"  # a reply this client could not read as the protocol says
TRANSPORT = "transport"  # refused, reset or timed out
# WebSocket error frames carry OpenAI's error type rather than a status.
STATUS_OF_TYPE = {
    "invalid_request_error": "400",
    "not_found_error": "404",
    "rate_limit_error": "429",
    "server_error": "500",
    "service_unavailable": "503",
}
Outcome = tuple[str, str]  # (outcome, detail)
# Where an entry of the server's log starts: Baton's logging format, or uvicorn's own.
LOG_ENTRY = re.compile(r"^(\d{4}-\d\d-\d\d [\d:,]+ |[A-Z]+: +)")
TRACE_LINES = ("Traceback", "During handling", "The above exception")
REQUEST_ID = re.compile(r"-\d+(-\d+)*")  # ws-925-2 → ws-N, so entries group by cause
READ_ERRORS = (ValueError, KeyError, TypeError, IndexError)


def bad_inputs(max_model_len: int) -> dict[str, tuple[str, bytes]]:
    """HTTP bodies that must be refused with a 4xx: name → (path, raw body)."""
    ok = {"prompt": "hello there", "max_tokens": 4}
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    raw = {
        "malformed_json": b'{"prompt": "hi", "max_tokens": ',
        "not_an_object": b"[1, 2, 3]",
        "invalid_utf8": b'{"prompt": "\xff\xfe"}',
        "lone_surrogate": b'{"prompt": "\\ud800"}',
        "nan": b'{"prompt": "hi", "temperature": NaN}',
        "deep_nesting": b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "oversized_body": b'{"prompt": "' + b"a" * (5 << 20) + b'"}',
        "prompt_ids_past_int64": b'{"prompt": [5, 100000000000000000000000000000]}',
    }
    completions = {
        "max_tokens_string": {"max_tokens": "16"},
        "max_tokens_negative": {"max_tokens": -1},
        "max_tokens_zero": {"max_tokens": 0},
        "max_tokens_1e308": {"max_tokens": 1e308},
        "max_tokens_past_context": {"max_tokens": 10**18},
        "temperature_negative": {"temperature": -1.0},
        "temperature_1e308": {"temperature": 1e308},
        "top_p_1e308": {"top_p": 1e308},
        "top_p_zero": {"top_p": 0.0},
        "top_k_string": {"top_k": "all"},
        "presence_penalty_-1e308": {"presence_penalty": -1e308},
        "logprobs_1e308": {"logprobs": 1e308},
        "n_5": {"n": 5},
        "seed_1e308": {"seed": 1e308},
        "stop_integers": {"stop": [1, 2]},
        "min_tokens_over_max": {"min_tokens": 8},
        "stream_string": {"stream": "yes"},
        "unknown_model": {"model": "no-such-model"},
        "prompt_null": {"prompt": None},
        "prompt_empty": {"prompt": ""},
        "prompt_empty_list": {"prompt": []},
        "prompt_ids_out_of_vocab": {"prompt": [5, 10**9]},
        "prompt_ids_negative": {"prompt": [-1, 5]},
        "prompt_ids_past_context": {"prompt": [5] * (max_model_len + 1)},
    }
    chats = {
        "chat_unknown_model": {"model": "no-such-model"},
        "chat_empty_messages": {"messages": []},
        "chat_messages_string": {"messages": "hello"},
        "chat_message_without_role": {"messages": [{"content": "hi"}]},
        "chat_image_content": {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]
        },
        "chat_max_completion_tokens_negative": {"max_completion_tokens": -1},
        "chat_top_logprobs_alone": {"top_logprobs": 2},
    }
    cases = {name: (COMPLETIONS, body) for name, body in raw.items()}
    cases |= {name: (COMPLETIONS, orjson.dumps({**ok, **b})) for name, b in completions.items()}
    cases |= {name: (CHAT, orjson.dumps({**chat, **body})) for name, body in chats.items()}
    cases["prompt_missing"] = (COMPLETIONS, b'{"max_tokens": 4}')
    return cases


def edge_inputs(max_model_len: int) -> dict[str, dict[str, Any]]:
    """Extreme but well-typed completion fields: serving or refusing them is fine, 5xx is not."""
    return {
        "temperature_1e-308": {"temperature": 1e-308},
        "top_p_1e-308": {"top_p": 1e-308, "temperature": 1.0},
        "top_k_huge": {"top_k": 10**18, "temperature": 1.0},
        "min_p_one": {"min_p": 1.0, "temperature": 1.0},
        "repetition_penalty_1e-308": {"repetition_penalty": 1e-308},
        "repetition_penalty_1e308": {"repetition_penalty": 1e308},
        "seed_negative": {"seed": -1, "temperature": 1.0},
        "seed_int64_max": {"seed": 2**63 - 1, "temperature": 1.0},
        "priority_huge": {"priority": 10**18},
        "priority_negative_huge": {"priority": -(10**18)},
        "slo_extreme": {"slo": {"ttft_ms": 1e308, "tpot_ms": 1e-300}},
        "stop_token_ids_out_of_vocab": {"stop_token_ids": [10**9]},
        "min_tokens_equal_max": {"min_tokens": 4, "ignore_eos": True},
        "stop_many": {"stop": ["x"] * 1000},
        "prompt_ids_fill_context": {"prompt": [5] * (max_model_len - 1), "max_tokens": 1},
    }


def bad_frames() -> dict[str, str | bytes]:
    """WebSocket frames that must get an error frame (and leave the socket open)."""
    ok = {"type": "generate", "id": "bad", "prompt": "hello there", "max_tokens": 4}
    frames = {
        "no_id": {key: value for key, value in ok.items() if key != "id"},
        "boolean_id": {**ok, "id": True},
        "unknown_type": {**ok, "type": "launch"},
        "prompt_and_messages": {**ok, "messages": [{"role": "user", "content": "hi"}]},
        "two_prompts": {**ok, "prompt": ["a", "b"]},
        "max_tokens_1e308": {**ok, "max_tokens": 1e308},
        "max_tokens_negative": {**ok, "max_tokens": -1},
        "unknown_model": {**ok, "model": "no-such-model"},
        "empty_messages": {"type": "generate", "id": "bad", "messages": []},
        "prompt_ids_out_of_vocab": {**ok, "prompt": [5, 10**9]},
    }
    return {
        "malformed_json": '{"type": "generate", "id": ',
        "not_an_object": "[1, 2]",
        "invalid_utf8_binary": b"\xff\xfe\xfd",
        **{name: orjson.dumps(frame).decode() for name, frame in frames.items()},
    }


def outcome_class(outcome: str) -> str:
    if outcome == ERROR_EVENT:
        return "5xx"
    return f"{outcome[0]}xx" if outcome[0].isdigit() else outcome


def expected(kind: str, outcome: str) -> bool:
    family = kind.split("/")[0]
    if family in ("bad", "ws_bad"):
        return outcome.startswith("4")
    if family == "edge":
        return outcome[0] in "24"
    if family.endswith("hangup"):
        return outcome in (HUNG_UP, "200", "429")
    return outcome in ("200", "429")  # a 429 is the queue limit doing its job


@dataclass(slots=True)
class Tally:
    """Every request's outcome by kind, and a few examples of each unexpected one."""

    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    findings: list[dict[str, str]] = field(default_factory=list)
    total: int = 0

    def record(self, kind: str, outcome: Outcome, sent: Any) -> None:
        status, detail = outcome
        self.outcomes[kind][status] += 1
        self.total += 1
        if not expected(kind, status) and self.outcomes[kind][status] <= 3:
            text = sent if isinstance(sent, (str, bytes)) else orjson.dumps(sent)
            text = text.decode(errors="replace") if isinstance(text, bytes) else text
            self.findings.append(
                {"kind": kind, "outcome": status, "detail": detail[:300], "input": text[:300]}
            )


@dataclass(slots=True)
class Run:
    args: argparse.Namespace
    client: httpx.AsyncClient
    tally: Tally
    bad: dict[str, tuple[str, bytes]]
    edge: dict[str, dict[str, Any]]
    frames: dict[str, str | bytes]
    deadline: float

    def more(self) -> bool:
        if self.args.duration is not None:
            return time.monotonic() < self.deadline
        return self.tally.total < self.args.requests

    async def post(
        self, path: str, body: bytes | dict, num_choices: int, hang_up_after: int = 0
    ) -> Outcome:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        try:
            async with self.client.stream("POST", path, content=content, headers=headers) as r:
                if r.status_code != 200:
                    return str(r.status_code), (await r.aread()).decode(errors="replace")
                if r.headers.get("content-type", "").startswith("text/event-stream"):
                    return await read_events(r, num_choices, hang_up_after)
                choices = orjson.loads(await r.aread())["choices"]
                if sum(1 for c in choices if c["finish_reason"]) == num_choices:
                    return "200", ""
                return INCOMPLETE, f"{len(choices)} choices, expected {num_choices} finished"
        except httpx.HTTPError as error:
            return TRANSPORT, repr(error)
        except READ_ERRORS as error:
            return MALFORMED, repr(error)

    def ws_connect(self) -> websockets.connect:
        url = f"ws://127.0.0.1:{self.args.port}/v1/ws"
        return websockets.connect(url, max_size=None, proxy=None, open_timeout=self.args.timeout)


async def read_events(response: httpx.Response, num_choices: int, hang_up_after: int) -> Outcome:
    finished: set[int] = set()
    num_chunks = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            if len(finished) == num_choices:
                return "200", ""
            return INCOMPLETE, f"[DONE] after {len(finished)} of {num_choices} finish reasons"
        event = orjson.loads(line[6:])
        if "error" in event:
            return ERROR_EVENT, event["error"]["message"]
        finished.update(c["index"] for c in event["choices"] if c["finish_reason"])
        num_chunks += 1
        if num_chunks == hang_up_after:
            return HUNG_UP, ""  # leaving the `async with` closes the connection mid-stream
    return INCOMPLETE, "the stream ended without [DONE]"


def words(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(3, 40)))


def sampling(rng: random.Random, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": rng.randint(1, max_tokens)}
    if rng.random() < 0.5:
        body |= {"temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randrange(2**31)}
    if rng.random() < 0.2:
        body["ignore_eos"] = True
    if rng.random() < 0.1:
        body["stop"] = [rng.choice(WORDS)]
    if rng.random() < 0.1:
        body |= {"top_p": 0.9, "top_k": 50}
    return body


def valid_body(rng: random.Random, max_tokens: int, ws: bool = False) -> tuple[str, dict, int]:
    """A random valid request: (path, body, number of choices it asks for)."""
    body = sampling(rng, max_tokens)
    if rng.random() < 0.5:
        turns = [
            {"role": ("user", "assistant")[i % 2], "content": words(rng)}
            for i in range(rng.choice([1, 3]))
        ]
        if rng.random() < 0.2:
            turns.insert(0, {"role": "system", "content": words(rng)})
        if rng.random() < 0.1:
            body |= {"logprobs": True, "top_logprobs": 2}
        return CHAT, {"messages": turns, **body}, 1
    prompts: list[Any] = [words(rng) for _ in range(2 if rng.random() < 0.15 and not ws else 1)]
    if rng.random() < 0.1:
        prompts[0] = [rng.randrange(3, 100) for _ in range(rng.randint(1, 30))]
    if rng.random() < 0.1:
        body["logprobs"] = 2
    return (
        COMPLETIONS,
        {"prompt": prompts[0] if len(prompts) == 1 else prompts, **body},
        len(prompts),
    )


def kind_of(path: str, prefix: str) -> str:
    return f"{prefix}_{'chat' if path == CHAT else 'completion'}"


async def streamed(run: Run, rng: random.Random) -> None:
    path, body, num_choices = valid_body(rng, run.args.max_tokens)
    body["stream"] = True
    if rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    run.tally.record(kind_of(path, "sse"), await run.post(path, body, num_choices), body)


async def whole(run: Run, rng: random.Random) -> None:
    path, body, num_choices = valid_body(rng, run.args.max_tokens)
    run.tally.record(kind_of(path, "whole"), await run.post(path, body, num_choices), body)


async def sse_hangup(run: Run, rng: random.Random) -> None:
    path, body, num_choices = valid_body(rng, run.args.max_tokens)
    body |= {"stream": True, "max_tokens": run.args.max_tokens, "ignore_eos": True}
    outcome = await run.post(path, body, num_choices, hang_up_after=rng.randint(1, 3))
    run.tally.record("sse_hangup", outcome, body)


async def whole_hangup(run: Run, rng: random.Random) -> None:
    path, body, num_choices = valid_body(rng, run.args.max_tokens)
    try:
        outcome = await asyncio.wait_for(run.post(path, body, num_choices), rng.uniform(0.01, 0.2))
    except asyncio.TimeoutError:
        outcome = HUNG_UP, ""
    run.tally.record("whole_hangup", outcome, body)


async def body_hangup(run: Run, rng: random.Random) -> None:
    """A client that goes before it has sent the whole body."""
    path, body, _ = valid_body(rng, run.args.max_tokens)
    content = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\n\r\n"
    )
    outcome: Outcome = HUNG_UP, ""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", run.args.port)
        writer.write(head.encode() + content[: len(content) // 2])
        await writer.drain()
        await asyncio.sleep(rng.uniform(0, 0.05))
        writer.close()
        await writer.wait_closed()
    except OSError as error:
        outcome = TRANSPORT, repr(error)
    run.tally.record("body_hangup", outcome, content)


async def bad_http(run: Run, rng: random.Random) -> None:
    name = rng.choice(list(run.bad))
    path, content = run.bad[name]
    run.tally.record(f"bad/{name}", await run.post(path, content, 1), content)


async def edge_http(run: Run, rng: random.Random) -> None:
    name = rng.choice(list(run.edge))
    body = {"prompt": words(rng), "max_tokens": 4, **run.edge[name], "stream": rng.random() < 0.5}
    run.tally.record(f"edge/{name}", await run.post(COMPLETIONS, body, 1), body)


def ws_frame(rng: random.Random, max_tokens: int, ident: str | int) -> dict[str, Any]:
    _, body, _ = valid_body(rng, max_tokens, ws=True)
    return {"type": "generate", "id": ident, **body}


async def ws_finals(socket: Any, ids: list[str | int], timeout: float) -> dict[Any, Outcome]:
    """Read frames until each of `ids` has its done or error frame."""
    pending, skipped = set(ids), set()
    next_index: dict[Any, int] = {}
    finals: dict[Any, Outcome] = {}
    while pending:
        message = orjson.loads(await asyncio.wait_for(socket.recv(), timeout))
        ident, kind = message["id"], message["type"]
        if kind == "token":
            if message["index"] != next_index.get(ident, 0):
                skipped.add(ident)
            next_index[ident] = message["index"] + 1
            continue
        pending.discard(ident)
        if kind == "error":
            error = message["error"]
            finals[ident] = STATUS_OF_TYPE.get(error["type"], "500"), error["message"]
        elif ident in skipped or message["finish_reason"] is None:
            finals[ident] = INCOMPLETE, f"token frames skipped or no finish_reason: {message}"
        else:
            finals[ident] = "200", message["finish_reason"]
    return finals


async def ws_session(run: Run, rng: random.Random) -> None:
    """Several requests multiplexed on one socket; one in three is cancelled after a pause."""
    frames = [ws_frame(rng, run.args.max_tokens, (i, f"r{i}")[i % 2]) for i in range(4)]
    cancels = {f["id"] for f in frames if rng.random() < 0.33}
    try:
        async with run.ws_connect() as socket:
            for frame in frames:
                await socket.send(orjson.dumps(frame).decode())
            await asyncio.sleep(rng.uniform(0, 0.1))
            for ident in [*cancels, "not-in-flight"]:  # an unknown id must be ignored
                await socket.send(orjson.dumps({"type": "cancel", "id": ident}).decode())
            finals = await ws_finals(socket, [f["id"] for f in frames], run.args.timeout)
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as error:
        finals = {f["id"]: (TRANSPORT, repr(error)) for f in frames}
    except READ_ERRORS as error:
        finals = {f["id"]: (MALFORMED, repr(error)) for f in frames}
    for frame in frames:
        kind = "ws_cancel" if frame["id"] in cancels else "ws_generate"
        run.tally.record(kind, finals[frame["id"]], frame)


async def ws_hangup(run: Run, rng: random.Random) -> None:
    """Requests in flight when the socket goes: closed cleanly, or the TCP connection dropped."""
    frames = [ws_frame(rng, run.args.max_tokens, i) for i in range(rng.randint(1, 3))]
    outcome: Outcome = HUNG_UP, ""
    try:
        socket = await run.ws_connect()
        for frame in frames:
            await socket.send(orjson.dumps(frame).decode())
        await asyncio.sleep(rng.uniform(0, 0.1))
        if rng.random() < 0.5:
            socket.transport.abort()
        await socket.close()
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as error:
        outcome = TRANSPORT, repr(error)
    for frame in frames:
        run.tally.record("ws_hangup", outcome, frame)


async def ws_bad(run: Run, rng: random.Random) -> None:
    """A bad frame must get an error frame, and a good one after it on the socket a done."""
    name = rng.choice(list(run.frames))
    bad = run.frames[name]
    good = ws_frame(rng, run.args.max_tokens, "good")
    try:
        async with run.ws_connect() as socket:
            await socket.send(bad)
            reply = orjson.loads(await asyncio.wait_for(socket.recv(), run.args.timeout))
            if reply["type"] == "error":
                error = reply["error"]
                outcome = STATUS_OF_TYPE.get(error["type"], "500"), error["message"]
            else:
                outcome = "200", f"answered with {reply['type']}"
            await socket.send(orjson.dumps(good).decode())
            after = (await ws_finals(socket, ["good"], run.args.timeout))["good"]
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as error:
        outcome = after = TRANSPORT, repr(error)
    except READ_ERRORS as error:
        outcome = after = MALFORMED, repr(error)
    run.tally.record(f"ws_bad/{name}", outcome, bad)
    run.tally.record("ws_generate", after, good)


SCENARIOS = (
    streamed,
    whole,
    sse_hangup,
    whole_hangup,
    body_hangup,
    ws_session,
    ws_hangup,
    bad_http,
    edge_http,
    ws_bad,
)
WEIGHTS = (30, 15, 6, 3, 1, 8, 2, 10, 5, 3)


async def worker(run: Run, rng: random.Random) -> None:
    while run.more():
        await rng.choices(SCENARIOS, WEIGHTS)[0](run, rng)


@dataclass(slots=True)
class Sample:
    elapsed_s: float
    requests: int
    rss_kb: int
    fds: int
    threads: int


def read_process(pid: int, elapsed_s: float, requests: int) -> Sample:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss_kb = int(status["VmRSS"].split()[0])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return Sample(elapsed_s, requests, rss_kb, fds, int(status["Threads"]))


async def sample_every(
    interval_s: float, pid: int, tally: Tally, started: float, samples: list[Sample]
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        sample = read_process(pid, time.monotonic() - started, tally.total)
        samples.append(sample)
        print(
            f"{sample.elapsed_s:7.0f} s  {sample.requests:6d} requests  "
            f"RSS {sample.rss_kb / 1024:7.1f} MB  {sample.fds:4d} fds  {sample.threads:3d} threads",
            file=sys.stderr,
        )


async def settled_gauges(base_url: str, timeout_s: float) -> tuple[dict[str, float], float]:
    """The gauges once both read 0, or as they stand after `timeout_s`; and the wait."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=10, trust_env=False) as client:
        while True:
            text = (await client.get("/metrics")).text
            gauges = {}
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name in GAUGES:
                    gauges[name] = float(value)
            waited = time.monotonic() - started
            if not any(gauges.values()) or waited > timeout_s:
                return gauges, waited
            await asyncio.sleep(0.5)


async def soak(args: argparse.Namespace, pid: int) -> dict[str, Any]:
    base_url = f"http://127.0.0.1:{args.port}"
    tally = Tally()
    samples = [read_process(pid, 0.0, 0)]
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    async with httpx.AsyncClient(
        base_url=base_url, timeout=args.timeout, limits=limits, trust_env=False
    ) as client:
        max_model_len = (await client.get("/v1/models")).json()["data"][0]["max_model_len"]
        started = time.monotonic()
        run = Run(
            args,
            client,
            tally,
            bad_inputs(max_model_len),
            edge_inputs(max_model_len),
            bad_frames(),
            started + (args.duration or 0),
        )
        sampler = asyncio.ensure_future(
            sample_every(args.sample_interval, pid, tally, started, samples)
        )
        try:
            await asyncio.gather(
                *(worker(run, random.Random(args.seed * 1000 + i)) for i in range(args.concurrency))
            )
        finally:
            sampler.cancel()
        elapsed = time.monotonic() - started
    samples.append(read_process(pid, elapsed, tally.total))
    gauges, settle_s = await settled_gauges(base_url, args.settle)
    await asyncio.sleep(1.0)  # the server closes its side of the sockets just let go
    end = read_process(pid, time.monotonic() - started, tally.total)
    return summarize(args, tally, samples, end, gauges, settle_s, elapsed)


def rss_trend(samples: list[Sample], warmup_share: float) -> dict[str, Any]:
    """RSS after warm-up and its least-squares growth per 1,000 requests from there on."""
    after = [s for s in samples if s.requests >= warmup_share * samples[-1].requests]
    last_half = [s for s in samples if s.requests >= samples[-1].requests / 2]
    return {
        "mb_start": round(samples[0].rss_kb / 1024, 1),
        "mb_after_warmup": round(after[0].rss_kb / 1024, 1),
        "mb_end": round(samples[-1].rss_kb / 1024, 1),
        "mb_max": round(max(s.rss_kb for s in samples) / 1024, 1),
        "growth_kb_per_1000_requests": growth_per_1000(after),
        "fit_samples": len(after),
        # A warm-up curve flattens here; a leak keeps its slope.
        "growth_kb_per_1000_requests_last_half": growth_per_1000(last_half),
    }


def growth_per_1000(samples: list[Sample]) -> int | None:
    if len({s.requests for s in samples}) < 2:
        return None
    slope, _ = statistics.linear_regression(
        [s.requests for s in samples], [s.rss_kb for s in samples]
    )
    return round(slope * 1000)


def summarize(
    args: argparse.Namespace,
    tally: Tally,
    samples: list[Sample],
    end: Sample,
    gauges: dict[str, float],
    settle_s: float,
    elapsed: float,
) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    accepted: dict[str, int] = {}
    num_failed = 0  # every unexpected outcome but a bad input served, which is a finding
    for kind, outcomes in sorted(tally.outcomes.items()):
        family = kind.split("/")[0]
        for outcome, n in outcomes.items():
            by_kind[family][outcome_class(outcome)] += n
            if family in ("bad", "ws_bad") and outcome.startswith("2"):
                accepted[kind] = accepted.get(kind, 0) + n
            elif not expected(kind, outcome):
                num_failed += n
    num_5xx = sum(classes["5xx"] for classes in by_kind.values())
    return {
        "requests": tally.total,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(tally.total / elapsed, 2),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "by_kind": {family: dict(classes) for family, classes in sorted(by_kind.items())},
        "outcomes": {kind: dict(outcomes) for kind, outcomes in sorted(tally.outcomes.items())},
        "num_5xx": num_5xx,
        "num_failed": num_failed,
        "bad_inputs_accepted": accepted,
        "rss": rss_trend(samples, args.warmup_share),
        "fds": {"start": samples[0].fds, "end": end.fds, "max": max(s.fds for s in samples)},
        "threads": {"start": samples[0].threads, "end": end.threads},
        "gauges_after": gauges,
        "settle_s": round(settle_s, 1),
        "findings": tally.findings,
        "gauges_zero": len(gauges) == len(GAUGES) and not any(gauges.values()),
        "samples": [
            [round(s.elapsed_s, 1), s.requests, s.rss_kb, s.fds, s.threads] for s in samples
        ],
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"{report['requests']} requests in {report['elapsed_s']} s "
        f"({report['requests_per_s']} req/s), concurrency {report['concurrency']}, "
        f"max_tokens {report['max_tokens']}"
    )
    columns = ("2xx", "4xx", "5xx", HUNG_UP)
    print(f"{'kind':16}{'sent':>7}" + "".join(f"{c:>9}" for c in columns) + "  other")
    for family, classes in report["by_kind"].items():
        other = {c: n for c, n in classes.items() if c not in columns}
        cells = "".join(f"{classes.get(c, 0):9d}" for c in columns)
        print(f"{family:16}{sum(classes.values()):7d}{cells}  {other or ''}")
    print("4xx by input (bad inputs must get 4xx; extreme values 2xx or 4xx):")
    for kind, outcomes in report["outcomes"].items():
        if "/" in kind:
            print(f"  {kind:44}" + ", ".join(f"{o}×{n}" for o, n in sorted(outcomes.items())))
    rss, fds, threads = report["rss"], report["fds"], report["threads"]
    print(
        f"RSS: start {rss['mb_start']} MB, after warm-up {rss['mb_after_warmup']} MB, end "
        f"{rss['mb_end']} MB, max {rss['mb_max']} MB; growth after warm-up "
        f"{rss['growth_kb_per_1000_requests']} kB per 1,000 requests ({rss['fit_samples']} "
        f"samples), over the last half {rss['growth_kb_per_1000_requests_last_half']} kB"
    )
    print(
        f"open fds: start {fds['start']}, end {fds['end']}, max {fds['max']}; threads: "
        f"start {threads['start']}, end {threads['end']}"
    )
    print(f"gauges {report['settle_s']} s after the load: {report['gauges_after']}")
    server = report["server"]
    print(
        f"server: exit status {server['exit_status_after_sigterm']} after SIGTERM, "
        f"{sum(server['log_errors'].values())} ERROR entries in {server['log']}"
    )
    for entry, n in server["log_errors"].items():
        print(f"  {n}× {entry}")
    for finding in report["findings"]:
        print(
            f"finding: {finding['kind']} → {finding['outcome']}: {finding['detail']!r} "
            f"(input {finding['input'][:120]!r})"
        )
    print(
        f"{'PASS' if report['passed'] else 'FAIL'}: {report['num_5xx']} 5xx, "
        f"{report['num_failed']} unexpected outcomes, gauges at 0: {report['gauges_zero']}, "
        f"server ERROR entries: {sum(server['log_errors'].values())}, bad inputs served: "
        f"{report['bad_inputs_accepted'] or 'none'}"
    )


def start_server(port: int, serve_args: list[str], log: Any) -> subprocess.Popen:
    # The venv's own `baton` script, so the child runs the code of this checkout.
    command = [str(Path(sys.executable).with_name("baton")), "serve", "--port", str(port)]
    child = subprocess.Popen([*command, *serve_args], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"baton serve exited with status {child.returncode}; see {log.name}")
        try:
            url = f"http://127.0.0.1:{port}/health"
            if httpx.get(url, timeout=5, trust_env=False).status_code == 200:
                return child
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    child.kill()
    raise SystemExit(f"baton serve did not answer /health within 300 s; see {log.name}")


def stop_server(child: subprocess.Popen) -> int:
    child.terminate()
    try:
        return child.wait(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def log_errors(path: Path) -> Counter[str]:
    """ERROR entries of the server's log, counted by first line and the exception they end in."""
    errors: Counter[str] = Counter()
    entry: list[str] = []
    for line in [*path.read_text(errors="replace").splitlines(), "END: "]:
        if not LOG_ENTRY.match(line):
            entry.append(line)
            continue
        if entry and any(level in entry[0] for level in ("ERROR", "CRITICAL")):
            ends = [e for e in entry[1:] if e[:1].isalnum() and not e.startswith(TRACE_LINES)]
            first = REQUEST_ID.sub("-N", LOG_ENTRY.sub("", entry[0]))
            errors[f"{first} | {ends[-1] if ends else ''}"[:300]] += 1
        entry = [line]
    return errors


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument(
        "--duration", type=float, default=None, help="run this many seconds instead of --requests"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="clients at once")
    parser.add_argument("--max-tokens", type=int, default=16, help="largest max_tokens sent")
    parser.add_argument("--port", type=int, default=8131)
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--sample-interval", type=float, default=5.0, help="seconds")
    parser.add_argument(
        "--warmup-share", type=float, default=0.1, help="share of requests before the RSS fit"
    )
    parser.add_argument("--settle", type=float, default=30.0, help="seconds for gauges to reach 0")
    parser.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-log", default=None, help="keep the server's output here")
    return parser.parse_args(argv)


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, serve_args = parse_args(argv[:split]), argv[split + 1 :]
    log_path = Path(args.server_log or Path(tempfile.gettempdir()) / f"baton-soak-{args.port}.log")
    with log_path.open("wb") as log:
        child = start_server(args.port, serve_args, log)
        try:
            report = asyncio.run(soak(args, child.pid))
        finally:
            exit_status = stop_server(child)
    errors = log_errors(log_path)
    report["server"] = {
        "args": serve_args,
        "exit_status_after_sigterm": exit_status,
        "log": str(log_path),
        "log_errors": dict(errors),
    }
    report["passed"] = (
        report["num_5xx"] == 0
        and report["num_failed"] == 0
        and report["gauges_zero"]
        and not errors
    )
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
