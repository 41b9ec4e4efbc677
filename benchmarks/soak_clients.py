"""The soak test's clients: each scenario (streamed, whole, hung up, bad input, WebSocket
sessions) sends one request or session and records its outcome in a tally by kind."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import websockets
from soak_inputs import CHAT, COMPLETIONS

from baton.app.commands.bench import WORDS

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
READ_ERRORS = (ValueError, KeyError, TypeError, IndexError)


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
