"""The attacks of issue 44 that benchmarks/faults.py replays against a running server, each an
async function of the server's address and the seconds it may take, that returns what the
server answered (a refusal, a 400, is the attack held off, and recorded as such)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    model: str
    vocab_size: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


Attack = Callable[[Target, float], Awaitable[str]]


def answers(outcomes: list[str]) -> str:
    """`outcomes` counted: "400 x6, dropped x2"."""
    return ", ".join(f"{what} x{count}" for what, count in sorted(Counter(outcomes).items()))


async def post_and_drop(target: Target, path: str, body: dict | str, drop_after_s: float) -> str:
    """POST `body` (a JSON text as it is); the status, or "dropped" where the client leaves
    after `drop_after_s`."""
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=target.base_url) as client:
        try:
            send = client.post(path, content=content, headers=headers, timeout=None)
            reply = await asyncio.wait_for(send, drop_after_s)
        except TimeoutError:
            return "dropped"
        except httpx.HTTPError as error:
            return type(error).__name__
    return str(reply.status_code)


def schema_body(target: Target, schema: dict) -> dict:
    return {
        "model": target.model,
        "prompt": "The answer:",
        "max_tokens": 16,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }


async def grammar_max_length(target: Target, seconds: float) -> str:
    """Six small schemas with a string of maxLength 5,000, each dropped by its client at 3 s."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 5000}},
        "required": ["a"],
    }
    sends = [
        post_and_drop(target, "/v1/completions", schema_body(target, schema), min(3.0, seconds))
        for _ in range(6)
    ]
    return answers(list(await asyncio.gather(*sends)))


async def grammar_enum(target: Target, seconds: float) -> str:
    """A schema whose enum holds 100,000 values, dropped by its client at 3 s."""
    schema = {"enum": [f"value-{i:06d}" for i in range(100_000)]}
    body = schema_body(target, schema)
    return await post_and_drop(target, "/v1/completions", body, min(3.0, seconds))


async def scoring(target: Target, seconds: float) -> str:
    """echo with logprobs 20 and n 16 over 8 prompts of 2,000 token ids."""
    rng = random.Random(0)
    prompts = [[rng.randrange(10, target.vocab_size) for _ in range(2000)] for _ in range(8)]
    body = {
        "model": target.model,
        "prompt": prompts,
        "echo": True,
        "logprobs": 20,
        "n": 16,
        "max_tokens": 1,
    }
    return await post_and_drop(target, "/v1/completions", body, seconds)


async def stop_token_ids(target: Target, seconds: float) -> str:
    """1.9 million stop_token_ids with n 16."""
    ids = [i % target.vocab_size for i in range(1_900_000)]
    body = {
        "model": target.model,
        "prompt": "Once upon a time",
        "max_tokens": 32,
        "n": 16,
        "stop_token_ids": ids,
    }
    return await post_and_drop(target, "/v1/completions", body, seconds)


async def deep_schema(target: Target, seconds: float) -> str:
    """Schemas nested 255, 512 and 1,024 arrays deep (written out by hand: Python's encoder
    refuses such depths)."""
    outcomes = []
    for depth in (255, 512, 1024):
        schema = '{"type": "array", "items": ' * depth + '{"type": "integer"}' + "}" * depth
        body = json.dumps(schema_body(target, {})).replace("{}", schema)
        outcomes.append(await post_and_drop(target, "/v1/completions", body, seconds))
    return answers(outcomes)


async def stats_polling(target: Target, seconds: float) -> str:
    """GET /v1/stats 50 times a second."""
    outcomes = []
    async with httpx.AsyncClient(base_url=target.base_url, timeout=10.0) as client:
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            try:
                outcomes.append(str((await client.get("/v1/stats")).status_code))
            except httpx.HTTPError as error:
                outcomes.append(type(error).__name__)
            await asyncio.sleep(max(0.0, 0.02 - (time.monotonic() - now)))
    return answers(outcomes)


def upgrade_request(target: Target, extra: str = "") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /v1/ws HTTP/1.1\r\nHost: {target.host}:{target.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"{extra}\r\n"
    ).encode()


async def first_bytes(reader: asyncio.StreamReader, wait_s: float) -> str:
    """What the server did with a connection within `wait_s`: answered (its status line),
    closed it, or nothing."""
    try:
        line = await asyncio.wait_for(reader.readline(), wait_s)
    except TimeoutError:
        return "no answer"
    except ConnectionError:
        return "reset"
    return line.decode(errors="replace").split(" ", 2)[1] if line else "closed"


async def ws_upgrade_with_body(target: Target, seconds: float, connections: int = 100) -> str:
    """`connections` WebSocket upgrade requests that carry a body, held open."""

    async def one() -> str:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        writer.write(upgrade_request(target, "Content-Length: 16\r\n") + b"0123456789abcdef")
        try:
            return await first_bytes(reader, seconds)
        finally:
            writer.close()

    return answers(list(await asyncio.gather(*(one() for _ in range(connections)))))


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """A client's frame: FIN, `opcode`, a payload under 126 bytes, masked as clients must."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return struct.pack("!BB", 0x80 | opcode, 0x80 | len(payload)) + mask + masked


async def ping_never_read(target: Target, seconds: float) -> str:
    """A WebSocket client that sends pings for `seconds` and never reads the pongs."""
    reader, writer = await asyncio.open_connection(target.host, target.port)
    writer.write(upgrade_request(target))
    status = await first_bytes(reader, 10.0)
    if status != "101":
        writer.close()
        return f"upgrade {status}"
    ping = masked_frame(0x9, b"p" * 125)
    sent, end, outcome = 0, time.monotonic() + seconds, "open"
    try:
        while time.monotonic() < end:
            writer.write(ping * 64)
            sent += 64 * len(ping)
            await asyncio.wait_for(writer.drain(), max(0.1, end - time.monotonic()))
    except TimeoutError:
        outcome = "send blocked"
    except ConnectionError:
        outcome = "closed by server"
    writer.close()
    return f"{outcome} after {sent / 2**20:.0f} MiB of pings"


async def slow_reader(target: Target, seconds: float, clients: int = 4) -> str:
    """`clients` long streams whose clients never read, for `seconds`, then hang up."""
    body = json.dumps(
        {
            "model": target.model,
            "prompt": "Once upon a time",
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def one() -> str:
        _, writer = await asyncio.open_connection(target.host, target.port)
        writer.write(request)
        await writer.drain()
        await asyncio.sleep(seconds)
        closed = writer.is_closing()
        writer.close()
        return "closed by server" if closed else "held"

    return answers(list(await asyncio.gather(*(one() for _ in range(clients)))))


ATTACKS: dict[str, Attack] = {
    "grammar_max_length": grammar_max_length,
    "grammar_enum": grammar_enum,
    "scoring": scoring,
    "ws_upgrade_with_body": ws_upgrade_with_body,
    "ping_never_read": ping_never_read,
    "stop_token_ids": stop_token_ids,
    "deep_schema": deep_schema,
    "stats_polling": stats_polling,
    "slow_reader": slow_reader,
}
